"""Cached bytes go first when a directory's quota needs room (issue 28: "cached bytes
of an attached directory count against its quota and are evicted first").

:meth:`Evictor.free_below` frees the filled chunks of the files below one directory,
by the cache's policy and never a pinned one, leaving every other directory's cache
alone; what it evicted reads again byte-exact (fetched anew).  It is the room-making
step of a write refused by a quota; the write path's call and the store's count of
cached bytes are not in yet (docs/cache.md, "Quotas").
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from conftest import start_cluster

from stager import Client
from stager.config import load_config
from stager.meta.http.cache import CACHE
from stager.testing import ThreadCluster
from stager.testing.countingsource import CountingSource

KiB = 1024
CHUNK = 64 * KiB


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("cquota"), chunk_size=CHUNK, replicas=1)
    yield c
    c.stop()


def test_a_directorys_cached_bytes_are_freed_by_policy_never_a_pin_nor_elsewhere(
        cluster: ThreadCluster, tmp_path_factory: pytest.TempPathFactory, ns: str) -> None:
    root = tmp_path_factory.mktemp("src")
    files = {f"{c}.bin": os.urandom(2 * CHUNK) for c in "abc"}
    for name, data in files.items():
        (root / name).write_bytes(data)
    with CountingSource(root) as server, \
            Client(cluster.meta_url, config=load_config(env={})) as client:
        client.attach(server.url + "/", f"{ns}/q/lake")
        client.attach(server.url + "/", f"{ns}/other")
        for d in ("q/lake", "other"):
            for name, data in files.items():
                assert client.cat(f"{ns}/{d}/{name}") == data

        def cached() -> dict[str, int]:
            return {a.path: a.cached_bytes for a in client.attachments()
                    if a.path.startswith(ns)}
        assert cached() == {f"{ns}/q/lake": 6 * CHUNK, f"{ns}/other": 6 * CHUNK}
        client.pin(f"{ns}/q/lake/b.bin")
        evictor = cluster.meta.app[CACHE].evictor          # type: ignore[union-attr]
        freed = cluster._call(evictor.free_below(f"{ns}/q", 3 * CHUNK))
        assert freed >= 3 * CHUNK
        assert cached() == {f"{ns}/q/lake": 6 * CHUNK - freed, f"{ns}/other": 6 * CHUNK}
        # asked for more than there is: all but the pinned file's chunks go
        freed += cluster._call(evictor.free_below(f"{ns}/q", 100 * CHUNK))
        assert freed == 4 * CHUNK
        assert cached() == {f"{ns}/q/lake": 2 * CHUNK, f"{ns}/other": 6 * CHUNK}
        gets = sum(server.gets.values())
        for name, data in files.items():
            assert client.cat(f"{ns}/q/lake/{name}") == data      # fetched anew
        assert sum(server.gets.values()) == gets + 4                # a's and c's chunks
