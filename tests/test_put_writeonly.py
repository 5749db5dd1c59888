"""``stager put`` with a write-only token (issue 26): creating files needs no read
scope (curl PUT and ``write_many`` never needed it); ``put`` asked for a stat of
the destination first, which a write-only token is refused.

One ``stager up --auth`` cluster (real processes); commands as a user types them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import assert_clean_error, stager

from stager.testing.cluster import ProcessCluster

pytestmark = pytest.mark.slow      # stager processes and the CLI: not in make check


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    with ProcessCluster(tmp_path_factory.mktemp("put-wo"), data_servers=2, auth=True) as c:
        yield c


def admin(up: ProcessCluster, *args: str) -> bytes:
    return stager("--token-file", str(up.root / "admin.token"), *args,
                  meta=up.meta_url).stdout


def test_a_write_only_token_puts_files_and_trees_below_its_prefix(
        up: ProcessCluster, tmp_path: Path) -> None:
    token = admin(up, "token", "create", "--scope", "write", "--prefix", "/drop",
                  "--name", "drop-box").decode().splitlines()[-1]
    env = {"STAGER_TOKEN": token}
    one = os.urandom(300_000)
    (tmp_path / "a.bin").write_bytes(one)
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    files = {"x.txt": b"x" * 10, "sub/y.bin": os.urandom(5 << 20)}
    for name, body in files.items():
        (tree / name).write_bytes(body)
    admin(up, "mkdir", "-p", "/drop/existing")

    def put(src: Path, dst: str) -> None:
        stager("put", str(src), dst, meta=up.meta_url, env=env)

    put(tmp_path / "a.bin", "/drop/a.bin")            # a new file
    put(tmp_path / "a.bin", "/drop/a.bin")            # replaced
    put(tmp_path / "a.bin", "/drop/into/")            # into a directory, by name
    put(tmp_path / "a.bin", "/drop/existing")         # into an existing directory
    put(tree, "/drop/tree")                           # a tree
    for path in ("/drop/a.bin", "/drop/into/a.bin", "/drop/existing/a.bin"):
        assert admin(up, "cat", path) == one, path
    for name, body in files.items():
        assert admin(up, "cat", f"/drop/tree/{name}") == body, name
    # still no read, and nothing outside the prefix
    assert_clean_error(stager("cat", "/drop/a.bin", meta=up.meta_url, env=env, check=False),
                       "lacks the 'read' scope")
    assert_clean_error(stager("put", str(tmp_path / "a.bin"), "/elsewhere.bin",
                              meta=up.meta_url, env=env, check=False), "does not cover")
