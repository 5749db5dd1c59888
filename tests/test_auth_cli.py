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

pytestmark = pytest.mark.slow      # stager processes and the CLI: not in make check


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


def test_a_failing_token_create_prints_nothing_and_leaves_the_file(up: ProcessCluster,
                                                                    tmp_path: Path) -> None:
    """`… token create … > FILE` once left an empty token file: a failure now prints
    one line on stderr, nothing on stdout, exits non-zero, and ``--out`` keeps what the
    file held (a failed rotation leaves the working token)."""
    kept = tmp_path / "hooks.token"
    kept.write_text("the token in use\n")
    rw = admin(up, "token", "create", "--scope", "read", "--ttl", "60").stdout.decode()
    create = ("token", "create", "--scope", "admin", "--ttl", "1h", "--name", "hooks")
    for out_args in ((), ("--out", str(kept))):
        tries = {
            "unreachable": stager("--token-file", str(up.root / "admin.token"), *create,
                                  *out_args, meta="http://127.0.0.1:9", check=False),
            "no token": stager(*create, *out_args, meta=up.meta_url, check=False),
            "missing token file": stager("--token-file", str(tmp_path / "none"), *create,
                                         *out_args, meta=up.meta_url, check=False),
            "not an admin": as_token(up, rw.splitlines()[-1], *create, *out_args,
                                     check=False),
            "bad ttl": admin(up, *create, "--ttl", "soon", *out_args, check=False),
        }
        for why, out in tries.items():
            assert out.stdout == b"", (why, out.stdout)
            assert_clean_error(out)
            assert kept.read_text() == "the token in use\n", why
    assert [p.name for p in tmp_path.iterdir()] == ["hooks.token"]     # no temporary left


def test_token_create_out_writes_a_private_file_and_rotates_it(up: ProcessCluster,
                                                               tmp_path: Path) -> None:
    path = tmp_path / "etc" / "hooks.token"
    tokens = []
    for _ in range(2):                                  # mint, then rotate over it
        out = admin(up, "token", "create", "--scope", "admin", "--ttl", "1h", "--name",
                    "hooks", "--out", str(path)).stdout.decode()
        assert out.count("\n") == 1 and out.strip().endswith(f"written to {path}"), out
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        tokens.append(path.read_text().strip())
        assert tokens[-1].startswith("stg1.") and tokens[-1] not in out
        assert stager("--token-file", str(path), "token", "list", meta=up.meta_url)
    assert tokens[0] != tokens[1]
    assert sorted(p.name for p in path.parent.iterdir()) == ["hooks.token"]


def test_the_slurm_hooks_token_recipe_of_deploy_readme(up: ProcessCluster,
                                                       tmp_path: Path) -> None:
    """deploy/README.md's line, pasted with the cluster's URL and paths: it mints the
    hooks' admin token into the file; with a wrong --meta it fails and writes nothing."""
    from test_deploy_readme import recipe_line

    line = recipe_line("token create", "--name slurm-hooks", "--meta")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "stager").write_text(f"#!/bin/sh\nexec {sys.executable} -m stager \"$@\"\n")
    (bin_dir / "stager").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    token_file = tmp_path / "etc-stager" / "slurm.token"

    def paste(meta: str) -> subprocess.CompletedProcess[str]:
        pasted = (line.replace("http://stager-meta.example:7070", meta)
                  .replace("/var/lib/stager/meta/admin.token", str(up.root / "admin.token"))
                  .replace("/etc/stager/slurm.token", str(token_file)))
        return subprocess.run(["sh", "-c", pasted], env=env, capture_output=True, text=True,
                              timeout=60)

    bad = paste("http://127.0.0.1:9")
    assert bad.returncode != 0 and bad.stdout == "", bad
    assert bad.stderr.startswith("stager: error: ") and not token_file.exists()
    good = paste(up.meta_url)
    assert good.returncode == 0, good.stderr
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    listed = stager("--token-file", str(token_file), "token", "list", meta=up.meta_url)
    row = [r for r in listed.stdout.decode().splitlines() if r.endswith("slurm-hooks")]
    assert len(row) == 1 and "admin" in row[0] and "valid" in row[0], row
