"""The `stager` command line, run as a subprocess against a real cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stager import Client
from stager.testing import ThreadCluster

pytestmark = pytest.mark.slow      # the CLI, a process per command: not in make check

SMALL = 64 * 1024


def stager(*args: str, meta: str | None, env: dict[str, str] | None = None,
           check: bool = True) -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable, "-m", "stager"]
    if meta is not None:
        argv += ["--meta", meta]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
    full_env.update(env or {})
    out = subprocess.run([*argv, *args], capture_output=True, env=full_env, timeout=60)
    if check:
        assert out.returncode == 0, out.stderr.decode()
    return out


def assert_clean_error(out: subprocess.CompletedProcess[bytes], *words: str) -> str:
    assert out.returncode != 0
    err = out.stderr.decode()
    assert err.startswith("stager: error: "), err
    assert "Traceback" not in err
    for word in words:
        assert word in err, err
    return err


def test_put_cat_get_ls_stat_rm(cluster: ThreadCluster, ns: str, tmp_path: Path,
                                payload) -> None:
    url = cluster.meta_url
    local = tmp_path / "local.bin"
    data = payload(SMALL * 3 + 5)
    local.write_bytes(data)
    out = stager("put", str(local), f"{ns}/dir/", "--chunk-size", "64KiB", meta=url)
    assert b"put 1 file(s)" in out.stderr
    assert stager("cat", f"{ns}/dir/local.bin", meta=url).stdout == data
    back = tmp_path / "back.bin"
    stager("get", f"{ns}/dir/local.bin", str(back), meta=url)
    assert back.read_bytes() == data
    # get into an existing local directory keeps the name
    stager("get", f"{ns}/dir/local.bin", str(tmp_path), meta=url)
    assert back.read_bytes() == (tmp_path / "local.bin").read_bytes()

    assert stager("ls", f"{ns}/dir", meta=url).stdout.decode().split() == ["local.bin"]
    long = stager("ls", "-l", f"{ns}/dir", meta=url).stdout.decode()
    assert long.startswith("-") and str(len(data)) in long and "local.bin" in long
    listing = json.loads(stager("ls", "--json", f"{ns}/dir", meta=url).stdout)
    assert [e["path"] for e in listing] == [f"{ns}/dir/local.bin"]
    assert stager("ls", meta=url).stdout.decode().split().count(ns[1:] + "/") == 1

    text = stager("stat", f"{ns}/dir/local.bin", meta=url).stdout.decode()
    assert f"size: {len(data)}" in text and "chunk_size=65536" in text
    body = json.loads(stager("stat", "--json", f"{ns}/dir/local.bin", meta=url).stdout)
    assert body["size"] == len(data) and body["type"] == "file"
    assert set(body["layout"]) >= {"chunk_size", "stripe_count", "replicas", "targets"}
    assert body["layout"]["chunk_size"] == SMALL
    assert len(body["layout"]["targets"]) == body["layout"]["stripe_count"] == 3

    stager("rm", f"{ns}/dir/local.bin", meta=url)
    assert_clean_error(stager("cat", f"{ns}/dir/local.bin", meta=url, check=False),
                       "local.bin")


def test_directories_mv_and_recursive_rm(cluster: ThreadCluster, client: Client, ns: str,
                                         tmp_path: Path) -> None:
    url = cluster.meta_url
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("a")
    (tree / "sub" / "b.txt").write_text("bb")
    out = stager("put", str(tree), f"{ns}/tree", meta=url)
    assert b"put 2 file(s)" in out.stderr
    assert client.cat(f"{ns}/tree/sub/b.txt") == b"bb"
    stager("mkdir", "-p", f"{ns}/x/y", "--chunk-size", "128KiB", "--replicas", "2", meta=url)
    shown = json.loads(stager("setstripe", f"{ns}/x/y", meta=url).stdout)
    assert shown == {"chunk_size": 128 * 1024, "replicas": 2}
    client.pipe(f"{ns}/x/y/f", b"f")
    lay = client.stat(f"{ns}/x/y/f", cached=False).layout
    assert lay is not None and (lay.chunk_size, lay.stripe_count, lay.replicas) == \
        (128 * 1024, 3, 2)
    # like `lfs setstripe`, setting a layout replaces the directory's whole default
    stager("setstripe", f"{ns}/x/y", "--stripe-count", "2", meta=url)
    assert json.loads(stager("setstripe", f"{ns}/x/y", meta=url).stdout) == {"stripe_count": 2}
    client.pipe(f"{ns}/x/y/g", b"g")
    lay = client.stat(f"{ns}/x/y/g", cached=False).layout
    assert lay is not None and (lay.chunk_size, lay.stripe_count, lay.replicas) == \
        (4 * 1024 * 1024, 2, 1)

    stager("mv", f"{ns}/tree/a.txt", f"{ns}/x/a.txt", meta=url)
    assert client.cat(f"{ns}/x/a.txt") == b"a"
    assert_clean_error(stager("mv", f"{ns}/x/a.txt", f"{ns}/x/y/f", meta=url, check=False),
                       "exists")
    stager("mv", "-f", f"{ns}/x/a.txt", f"{ns}/x/y/f", meta=url)
    assert client.cat(f"{ns}/x/y/f") == b"a"

    assert_clean_error(stager("rm", f"{ns}/tree", meta=url, check=False), "not empty")
    stager("rm", "-r", f"{ns}/tree", f"{ns}/x", meta=url)
    assert not client.exists(f"{ns}/tree") and not client.exists(f"{ns}/x")


def test_status(cluster: ThreadCluster) -> None:
    text = stager("status", meta=cluster.meta_url).stdout.decode()
    assert text.startswith("3/3 targets up on 3 node(s)")
    for i in range(3):
        assert cluster.target_id(i) in text and f"node{i}" in text
    body = json.loads(stager("status", "--json", meta=cluster.meta_url).stdout)
    assert body["targets_up"] == 3 and body["nodes"] == 3
    assert sorted(t["id"] for t in body["targets"]) == sorted(cluster.target_id(i)
                                                              for i in range(3))
    assert all(t["state"] == "up" for t in body["targets"])


def test_meta_url_from_the_environment(cluster: ThreadCluster, client: Client,
                                       ns: str) -> None:
    client.pipe(f"{ns}/env.bin", b"from env")
    env = {"STAGER_META_URL": cluster.meta_url}
    assert stager("cat", f"{ns}/env.bin", meta=None, env=env).stdout == b"from env"
    # --meta wins over the environment
    bad = {"STAGER_META_URL": "http://127.0.0.1:9"}
    assert stager("cat", f"{ns}/env.bin", meta=cluster.meta_url, env=bad).stdout == b"from env"


def test_clear_errors_and_exit_codes(cluster: ThreadCluster, client: Client, ns: str,
                                    tmp_path: Path) -> None:
    url = cluster.meta_url
    client.mkdir(ns)
    assert_clean_error(stager("cat", f"{ns}/missing", meta=url, check=False), "missing")
    assert_clean_error(stager("stat", f"{ns}/missing", meta=url, check=False), "missing")
    assert_clean_error(stager("get", f"{ns}/missing", str(tmp_path / "o"), meta=url,
                              check=False))
    assert not (tmp_path / "o").exists()
    assert_clean_error(stager("put", str(tmp_path / "no-such-file"), f"{ns}/x", meta=url,
                              check=False), "no-such-file")
    assert_clean_error(stager("ls", "/a/../b", meta=url, check=False), "..")
    assert_clean_error(stager("put", __file__, f"{ns}/y", "--chunk-size", "lots", meta=url,
                              check=False), "lots")
    assert_clean_error(stager("stat", "/", meta="http://127.0.0.1:9", check=False),
                       "127.0.0.1:9")
    usage = stager("frobnicate", meta=url, check=False)
    assert usage.returncode == 2 and b"invalid choice" in usage.stderr


@pytest.mark.parametrize("cmd", ["put", "get", "cat", "ls", "stat", "rm", "mkdir", "mv",
                                 "setstripe", "status", "up", "meta", "data"])
def test_every_subcommand_has_help(cmd: str, capsys: pytest.CaptureFixture[str]) -> None:
    from stager.cli.main import build_parser

    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([cmd, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: stager " + cmd)
