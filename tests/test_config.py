"""Configuration: defaults ← TOML file ← STAGER_* environment ← flags, and size parsing."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from stager.config import DEFAULT_META_URL, Config, load_config, parse_size
from stager.errors import BadRequest


@pytest.mark.parametrize("text, value", [
    ("0", 0), ("17", 17), ("17B", 17), ("4KiB", 4096), ("4K", 4096), ("4kb", 4096),
    ("4MiB", 4 << 20), ("4 MiB", 4 << 20), (" 2G ", 2 << 30), ("1TiB", 1 << 40),
    ("1.5MiB", 3 << 19), ("64k", 64 << 10), (123, 123),
])
def test_parse_size(text: str | int, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("bad", ["", "lots", "4 XB", "-1", "1e6", "MiB", "4MiBs"])
def test_parse_size_refuses_nonsense(bad: str) -> None:
    with pytest.raises(BadRequest) as err:
        parse_size(bad)
    assert isinstance(err.value, ValueError) and repr(bad) in str(err.value)


def test_defaults() -> None:
    config = load_config(env={})
    assert config == Config()
    assert config.meta_url == DEFAULT_META_URL == "http://127.0.0.1:7070"
    assert config.chunk_size == 4 << 20 and config.replicas == 1
    assert config.stripe_count == 0 and config.max_stripe_count == 8
    assert config.public_url == "http://127.0.0.1:7070"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.port = 1  # type: ignore[misc]


def test_layers_file_env_flags(tmp_path: Path) -> None:
    toml = tmp_path / "stager.toml"
    toml.write_text('chunk_size = "8MiB"\nport = 7100\nreplicas = 2\n'
                    'heartbeat_interval = 0.5\nnode = "from-file"\n')
    env = {"STAGER_PORT": "7200", "STAGER_REPLICAS": "3", "STAGER_UNRELATED": "x"}
    config = load_config({"replicas": 4, "node": None}, env=env, path=toml)
    assert config.chunk_size == 8 << 20           # file
    assert config.heartbeat_interval == 0.5      # file
    assert config.port == 7200                   # env over file
    assert config.replicas == 4                  # flag over env
    assert config.node == "from-file"            # a flag of None means "not given"
    assert load_config(env=env, path=toml).replicas == 3


def test_config_file_from_the_environment(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text('meta_url = "http://meta:9000"\nmax_upload_size = "1GiB"\n')
    config = load_config(env={"STAGER_CONFIG": str(toml)})
    assert config.meta_url == "http://meta:9000" and config.max_upload_size == 1 << 30
    # an explicit path wins over STAGER_CONFIG
    other = tmp_path / "other.toml"
    other.write_text("port = 1\n")
    assert load_config(env={"STAGER_CONFIG": str(toml)}, path=other).port == 1


def test_role_defaults_sit_under_everything(tmp_path: Path) -> None:
    assert load_config(env={}, defaults={"port": 0}).port == 0
    assert load_config(env={"STAGER_PORT": "9"}, defaults={"port": 0}).port == 9
    toml = tmp_path / "c.toml"
    toml.write_text("port = 8\n")
    assert load_config(env={}, path=toml, defaults={"port": 0}).port == 8


def test_environment_values_are_coerced() -> None:
    env = {"STAGER_CHUNK_SIZE": "1MiB", "STAGER_RETRIES": "5", "STAGER_TARGET_TIMEOUT": "2.5",
           "STAGER_CAPACITY": "10GiB", "STAGER_HOST": "0.0.0.0"}
    config = load_config(env=env)
    assert config.chunk_size == 1 << 20 and config.retries == 5
    assert config.target_timeout == 2.5 and config.capacity == 10 << 30
    assert config.host == "0.0.0.0"
    assert config.replace(port=1234, advertise_url="").public_url == "http://0.0.0.0:1234"
    assert config.replace(advertise_url="http://node7:7070").public_url == "http://node7:7070"


@pytest.mark.parametrize("layer", ["flag", "env", "file"])
def test_bad_values_and_unknown_keys(tmp_path: Path, layer: str) -> None:
    toml = tmp_path / "c.toml"
    for key, value in [("port", "eighty"), ("chunk_size", "big"), ("retries", "1.5x"),
                       ("event_loop", "trio")]:
        with pytest.raises(BadRequest) as err:
            if layer == "flag":
                load_config({key: value}, env={})
            elif layer == "env":
                load_config(env={"STAGER_" + key.upper(): value})
            else:
                toml.write_text(f'{key} = "{value}"\n')
                load_config(env={}, path=toml)
        assert key in str(err.value)
    with pytest.raises(BadRequest, match="unknown configuration key"):
        if layer == "file":
            toml.write_text("colour = 1\n")
            load_config(env={}, path=toml)
        else:
            load_config({"colour": 1}, env={})


def test_replace_coerces_sizes() -> None:
    config = Config().replace(chunk_size="1MiB", max_json_body=1024)
    assert config.chunk_size == 1 << 20 and config.max_json_body == 1024
    with pytest.raises(BadRequest):
        Config().replace(nonsense=1)
