"""Auth from the command line: ``stager up --auth``, ``stager token``, refusals.

One ``stager up --auth`` cluster (real processes) for the module; every command
runs as a subprocess with a clean environment, as a user would type it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import assert_clean_error, stager

from stager.testing.cluster import ProcessCluster


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    c = ProcessCluster(tmp_path_factory.mktemp("auth-up"), data_servers=2, auth=True)
    c.start()
    yield c
    c.stop()


def admin(up: ProcessCluster, *args: str, check: bool = True
          ) -> subprocess.CompletedProcess[bytes]:
    return stager("--token-file", str(up.root / "admin.token"), *args, meta=up.meta_url,
                  check=check)


def as_token(up: ProcessCluster, token: str, *args: str, check: bool = True
             ) -> subprocess.CompletedProcess[bytes]:
    return stager(*args, meta=up.meta_url, env={"STAGER_TOKEN": token}, check=check)


def test_up_auth_keeps_its_secrets_private_and_says_so(up: ProcessCluster) -> None:
    info = json.loads((up.root / "cluster.json").read_text())
    assert info["auth"] is True
    assert info["admin_token_file"] == str(up.root / "admin.token")
    for secret in (up.root / "admin.token", up.root / "auth" / "signing.key",
                   up.root / "auth" / "join.token"):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    assert stat.S_IMODE((up.root / "auth").stat().st_mode) == 0o700


def test_without_a_token_every_command_is_refused_cleanly(up: ProcessCluster,
                                                          tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    for args in (("ls", "/"), ("put", str(tmp_path / "f"), "/nope"), ("status",),
                 ("token", "list")):
        assert_clean_error(stager(*args, meta=up.meta_url, check=False), "needs a token")
    out = as_token(up, "stg1.not.atoken", "ls", "/", check=False)
    assert_clean_error(out, "malformed")


def test_a_team_token_reads_its_dataset_only_until_revoked(up: ProcessCluster,
                                                            tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(os.urandom(300_000))
    admin(up, "put", str(tmp_path / "a.bin"), "/datasets/imagenet/a.bin")
    admin(up, "put", str(tmp_path / "a.bin"), "/datasets/private/b.bin")
    made = admin(up, "token", "create", "--scope", "read", "--prefix", "/datasets/imagenet",
                 "--ttl", "8h", "--name", "team-a").stdout.decode().splitlines()
    token = made[-1]                            # the token is the last line
    assert token.startswith("stg1.") and "team-a" in made[0]

    got = as_token(up, token, "cat", "/datasets/imagenet/a.bin").stdout
    assert got == (tmp_path / "a.bin").read_bytes()
    assert_clean_error(as_token(up, token, "cat", "/datasets/private/b.bin", check=False),
                       "does not cover /datasets/private/b.bin")
    assert_clean_error(as_token(up, token, "put", str(tmp_path / "a.bin"),
                                "/datasets/imagenet/c.bin", check=False), "'write' scope")
    # The listing shows the way down to the dataset, and nothing beside it.
    assert as_token(up, token, "ls", "/datasets").stdout.decode().split() == ["imagenet/"]

    listed = [line.split() for line in admin(up, "token", "list").stdout.decode().splitlines()]
    [row] = [r for r in listed if r[-1] == "team-a"]
    assert row[1:4] == ["valid", "read", "/datasets/imagenet"]
    admin(up, "token", "revoke", row[0])
    assert_clean_error(as_token(up, token, "cat", "/datasets/imagenet/a.bin", check=False),
                       "revoked")
    assert [r[1] for r in (line.split() for line in admin(up, "token", "list").stdout
                           .decode().splitlines()) if r[0] == row[0]] == ["revoked"]


def test_only_an_admin_mints_tokens(up: ProcessCluster) -> None:
    made = admin(up, "token", "create", "--scope", "read", "--scope", "write", "--ttl", "60")
    rw = made.stdout.decode().splitlines()[-1]
    out = as_token(up, rw, "token", "create", "--scope", "admin", check=False)
    assert_clean_error(out, "'admin' scope")
    assert_clean_error(admin(up, "token", "create", "--scope", "read", "--ttl", "soon",
                             check=False), "not a duration")


def test_a_public_address_needs_auth_or_insecure(tmp_path: Path) -> None:
    for role in ("meta", "data"):
        out = stager(role, "--root", str(tmp_path / role), "--host", "0.0.0.0", "--port", "0",
                     meta="http://127.0.0.1:9", check=False)
        err = assert_clean_error(out, "refusing to serve 0.0.0.0 without auth", "--insecure")
        assert len(err.strip().splitlines()) == 1
    # Told --insecure, it starts (and is stopped here).
    with open(tmp_path / "open.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "stager", "meta", "--root",
                                 str(tmp_path / "open"), "--host", "0.0.0.0", "--port", "0",
                                 "--insecure"], stderr=log)
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "open" / "server.json").exists():
            assert proc.poll() is None, (tmp_path / "open.log").read_text()
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_data_server_with_auth_needs_a_join_token(tmp_path: Path) -> None:
    out = stager("data", "--root", str(tmp_path), "--port", "0", "--auth",
                 meta="http://127.0.0.1:9", check=False)
    assert_clean_error(out, "join", "--token-file")
