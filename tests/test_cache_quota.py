"""Cached bytes against quotas, evicted first (issue 28: "cached bytes of an attached
directory count against its quota and are evicted first"), on each metadata store.

A file of an attached directory counts its filled bytes only, from its fill to its
eviction, refresh or detach.  :meth:`Evictor.free_below` frees the filled chunks of
the files below one directory, by the cache's policy and never a pinned one, leaving
every other directory's cache alone; a write or a fill that would pass a quota has
it free that quota directory's cached bytes first, and is refused with 507
``quota_exceeded`` (nothing of it visible) only where that is not enough.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import STORES, meta_store_of, start_cluster

from stager import Client
from stager.config import load_config
from stager.errors import NotFound, QuotaExceeded
from stager.meta.http.cache import CACHE
from stager.testing import ThreadCluster
from stager.testing.countingsource import CountingSource

KiB = 1024
CHUNK = 64 * KiB


@pytest.fixture(scope="module", params=STORES)
def cluster(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("cquota"), chunk_size=CHUNK, replicas=1,
                      meta_store=meta_store_of(request))
    yield c
    c.stop()


@pytest.fixture(scope="module")
def client(cluster: ThreadCluster) -> Iterator[Client]:
    with Client(cluster.meta_url, config=load_config(env={})) as c:
        yield c


def source(tmp_path_factory: pytest.TempPathFactory, names: str,
           chunks: int = 2) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path_factory.mktemp("src")
    files = {f"{c}.bin": os.urandom(chunks * CHUNK) for c in names}
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root, files


def use(client: Client, path: str) -> tuple[int, int]:
    [q] = [q for q in client.quotas() if q.path == path]
    return q.used_bytes, q.used_files


def cached(client: Client, ns: str) -> dict[str, int]:
    return {a.path: a.cached_bytes for a in client.attachments() if a.path.startswith(ns)}


def attach_two_and_read(client: Client, url: str, ns: str, files: dict[str, bytes]) -> None:
    """The source attached at ``ns/q/lake`` (under the quota) and ``ns/other`` (not),
    every file read whole through both, so both are fully cached."""
    for d in ("q/lake", "other"):
        client.attach(url + "/", f"{ns}/{d}")
    for d in ("q/lake", "other"):
        for name, data in files.items():
            assert client.cat(f"{ns}/{d}/{name}") == data


def test_a_directorys_cached_bytes_are_freed_by_policy_never_a_pin_nor_elsewhere(
        cluster: ThreadCluster, client: Client, tmp_path_factory: pytest.TempPathFactory,
        ns: str) -> None:
    root, files = source(tmp_path_factory, "abc")
    with CountingSource(root) as server:
        attach_two_and_read(client, server.url, ns, files)
        assert cached(client, ns) == {f"{ns}/q/lake": 6 * CHUNK, f"{ns}/other": 6 * CHUNK}
        client.pin(f"{ns}/q/lake/b.bin")
        evictor = cluster.meta.app[CACHE].evictor          # type: ignore[union-attr]
        freed = cluster.call(evictor.free_below(f"{ns}/q", 3 * CHUNK))
        assert freed >= 3 * CHUNK
        assert cached(client, ns) == {f"{ns}/q/lake": 6 * CHUNK - freed, f"{ns}/other": 6 * CHUNK}
        # asked for more than there is: all but the pinned file's chunks go
        freed += cluster.call(evictor.free_below(f"{ns}/q", 100 * CHUNK))
        assert freed == 4 * CHUNK
        assert cached(client, ns) == {f"{ns}/q/lake": 2 * CHUNK, f"{ns}/other": 6 * CHUNK}
        gets = sum(server.gets.values())
        for name, data in files.items():
            assert client.cat(f"{ns}/q/lake/{name}") == data      # fetched anew
        assert sum(server.gets.values()) == gets + 4                # a's and c's chunks


def test_a_quota_counts_an_attached_directorys_filled_bytes_only(
        cluster: ThreadCluster, client: Client, tmp_path_factory: pytest.TempPathFactory,
        ns: str) -> None:
    root, files = source(tmp_path_factory, "abc")
    with CountingSource(root) as server:
        client.attach(server.url + "/", f"{ns}/q/lake")
        client.set_quota(f"{ns}/q", max_bytes=100 * CHUNK)
        assert use(client, f"{ns}/q") == (0, 3)                 # listed, nothing fetched
        assert client.cat(f"{ns}/q/lake/a.bin") == files["a.bin"]
        assert use(client, f"{ns}/q") == (2 * CHUNK, 3)         # a's two fills
        assert client.cat(f"{ns}/q/lake/b.bin", start=0, end=10) == files["b.bin"][:10]
        assert use(client, f"{ns}/q") == (3 * CHUNK, 3)
        evictor = cluster.meta.app[CACHE].evictor          # type: ignore[union-attr]
        freed = cluster.call(evictor.free_below(f"{ns}/q", CHUNK))
        assert use(client, f"{ns}/q") == (3 * CHUNK - freed, 3)  # evicted: down
        for name, data in files.items():
            assert client.cat(f"{ns}/q/lake/{name}") == data
        assert use(client, f"{ns}/q") == (6 * CHUNK, 3)
        # a quota set now counts the same (its subtree summed once)
        client.set_quota(f"{ns}/q", max_bytes=100 * CHUNK)
        assert use(client, f"{ns}/q") == (6 * CHUNK, 3)
        # changed at the source and refreshed: the old version's fills leave
        (root / "c.bin").write_bytes(b"c" * (CHUNK + 1))
        client.refresh(f"{ns}/q/lake")
        assert use(client, f"{ns}/q") == (4 * CHUNK, 3)
        client.pipe(f"{ns}/q/own", b"o" * 1000)                 # written bytes count whole
        assert use(client, f"{ns}/q") == (4 * CHUNK + 1000, 4)
        client.detach(f"{ns}/q/lake")
        assert use(client, f"{ns}/q") == (1000, 1)


def test_a_write_past_the_quota_evicts_the_directorys_cache_first(
        cluster: ThreadCluster, client: Client, tmp_path_factory: pytest.TempPathFactory,
        ns: str) -> None:
    root, files = source(tmp_path_factory, "abc")
    with CountingSource(root) as server:
        attach_two_and_read(client, server.url, ns, files)
        client.set_quota(f"{ns}/q", max_bytes=7 * CHUNK)
        client.pin(f"{ns}/q/lake/b.bin")
        assert use(client, f"{ns}/q") == (6 * CHUNK, 3)
        first = os.urandom(3 * CHUNK)
        client.pipe(f"{ns}/q/w1", first)            # 9 > 7: two chunks (at least) evicted
        assert client.cat(f"{ns}/q/w1") == first
        lake = cached(client, ns)[f"{ns}/q/lake"]
        assert 2 * CHUNK <= lake <= 4 * CHUNK
        assert use(client, f"{ns}/q") == (3 * CHUNK + lake, 4)
        assert cached(client, ns)[f"{ns}/other"] == 6 * CHUNK      # another directory's
        # 3 written + 2 pinned + 4 = 9 > 7 even with every unpinned chunk gone: refused
        with pytest.raises(QuotaExceeded) as refused:
            client.pipe(f"{ns}/q/w2", os.urandom(4 * CHUNK))
        assert refused.value.details["directory"] == f"{ns}/q"
        assert refused.value.details["limit"] == 7 * CHUNK
        with pytest.raises(NotFound):
            client.stat(f"{ns}/q/w2")                   # nothing of it is visible
        assert cached(client, ns) == {f"{ns}/q/lake": 2 * CHUNK, f"{ns}/other": 6 * CHUNK}
        assert use(client, f"{ns}/q") == (5 * CHUNK, 4)
        gets = sum(server.gets.values())
        assert client.cat(f"{ns}/q/lake/b.bin") == files["b.bin"]     # the pin kept it
        assert sum(server.gets.values()) == gets
        client.pipe(f"{ns}/q/w2", os.urandom(2 * CHUNK))           # up to the limit: fits
        assert use(client, f"{ns}/q") == (7 * CHUNK, 5)


def test_a_fill_past_the_quota_evicts_first_and_is_refused_where_all_is_pinned(
        cluster: ThreadCluster, client: Client, tmp_path_factory: pytest.TempPathFactory,
        ns: str) -> None:
    root, files = source(tmp_path_factory, "ab")
    with CountingSource(root) as server:
        client.attach(server.url + "/", f"{ns}/q/lake")
        client.set_quota(f"{ns}/q", max_bytes=3 * CHUNK)
        client.pin(f"{ns}/q/lake")
        assert client.cat(f"{ns}/q/lake/a.bin") == files["a.bin"]
        with pytest.raises(QuotaExceeded) as refused:       # a's chunks are pinned
            client.cat(f"{ns}/q/lake/b.bin")
        assert refused.value.details["directory"] == f"{ns}/q"
        assert use(client, f"{ns}/q") == (3 * CHUNK, 2)
        client.unpin(f"{ns}/q/lake")
        assert client.cat(f"{ns}/q/lake/b.bin") == files["b.bin"]   # a's go instead
        assert use(client, f"{ns}/q")[0] <= 3 * CHUNK
        assert client.cat(f"{ns}/q/lake/a.bin") == files["a.bin"]   # fetched anew
        assert use(client, f"{ns}/q")[0] <= 3 * CHUNK
        assert server.gets
