"""Resolved manifests served from the metadata server's cache (stager/meta/snapshots.py):
every change visible to a resolution is seen by the next GET, on both stores and
across two metadata servers on one PostgreSQL; a current ETag gets 304; many
requests for a manifest not yet resolved share one resolution."""

from __future__ import annotations

import asyncio
import gzip
import json
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
from conftest import STORES, cluster_on_each_store, raw_http

from stager import Client
from stager.config import Config
from stager.meta.http.app import SERVICE
from stager.meta.service import MetaService
from stager.meta.snapshots import Snapshot, SnapshotCache
from stager.meta.store.base import Upload
from stager.meta.store.sqlite.store import SQLiteStore
from stager.protocol.manifest import Manifest, ManifestFile
from stager.protocol.models import Layout, TargetInfo
from stager.testing import ProcessCluster, ThreadCluster

pytestmark = pytest.mark.slow      # stager processes on PostgreSQL: not in make check

cluster = pytest.fixture(scope="module", params=STORES, name="cluster")(cluster_on_each_store)


def service_of(cluster: ThreadCluster) -> MetaService:
    assert cluster.meta is not None
    return cluster.meta.app[SERVICE]


def record(client: Client, ds: str, count: int = 4) -> list[str]:
    """``count`` files under ``ds`` and a manifest naming them; their paths."""
    files = []
    for i in range(count):
        info = client.pipe(f"{ds}/sub/f{i}", bytes([i]) * 100)
        files.append(ManifestFile(f"sub/f{i}", info.size, info.mtime, info.file_id))
    client.put_manifest(Manifest(ds, tuple(files), source="test", created=time.time()))
    return [f.path for f in files]


def stale(client: Client, ds: str) -> list[str]:
    manifest = client.get_manifest(ds)
    assert manifest is not None
    return [f.path for f in manifest.files if f.stale]


def test_each_change_is_seen_by_the_next_get(cluster: ThreadCluster, client: Client,
                                             ns: str) -> None:
    ds = f"{ns}/ds"
    record(client, ds)
    cache = service_of(cluster).snapshots
    first = client.get_manifest(ds)
    made, served = cache.resolutions, cache.hits
    assert client.get_manifest(ds) is first         # revalidated: 304, the one it holds
    assert (cache.resolutions, cache.hits) == (made, served)
    assert stale(client, ds) == []
    client.pipe(f"{ds}/sub/f1", b"new")             # a commit over a listed file
    assert stale(client, ds) == ["sub/f1"]
    client.rename(f"{ds}/sub/f2", f"{ns}/away")     # renamed out of the dataset
    assert stale(client, ds) == ["sub/f1", "sub/f2"]
    client.rename(f"{ns}/away", f"{ds}/sub/f2")     # ... and back in
    assert stale(client, ds) == ["sub/f1"]
    client.rm(f"{ds}/sub/f3")
    assert stale(client, ds) == ["sub/f1", "sub/f3"]
    client.pipe(f"{ns}/elsewhere/x", b"x")          # outside: the cached answer stands
    made = cache.resolutions
    assert stale(client, ds) == ["sub/f1", "sub/f3"]
    assert cache.resolutions == made
    record(client, ds)                              # stored again: all fresh
    assert stale(client, ds) == []
    client.rename(ds, f"{ns}/moved")                # the dataset itself moves
    assert stale(client, f"{ns}/moved") == []
    client.rm(f"{ns}/moved/sub", recursive=True)
    assert stale(client, f"{ns}/moved") == [f"sub/f{i}" for i in range(4)]


def test_etag_304_and_both_encodings(cluster: ThreadCluster, client: Client, ns: str) -> None:
    record(client, f"{ns}/ds")
    url = f"/v1/manifest{ns}/ds"
    plain = raw_http(cluster.meta_url, "GET", url)
    assert plain.status == 200 and plain.headers.get("Content-Encoding") is None
    etag = plain.headers["ETag"]
    assert etag.startswith('W/"')
    body = json.loads(plain.body)
    assert len(body["files"]) == 4 and body["path"] == f"{ns}/ds"
    packed = raw_http(cluster.meta_url, "GET", url, headers={"Accept-Encoding": "gzip"})
    assert packed.headers["Content-Encoding"] == "gzip" and packed.headers["ETag"] == etag
    assert gzip.decompress(packed.body) == plain.body
    made = service_of(cluster).snapshots.resolutions
    again = raw_http(cluster.meta_url, "GET", url, headers={"If-None-Match": etag})
    assert (again.status, again.body, again.headers["ETag"]) == (304, b"", etag)
    other = raw_http(cluster.meta_url, "GET", url, headers={"If-None-Match": 'W/"other"'})
    assert other.status == 200 and other.body == plain.body
    assert service_of(cluster).snapshots.resolutions == made
    client.pipe(f"{ns}/ds/sub/f0", b"changed")
    moved = raw_http(cluster.meta_url, "GET", url, headers={"If-None-Match": etag})
    assert moved.status == 200 and moved.headers["ETag"] != etag
    assert raw_http(cluster.meta_url, "GET", f"/v1/manifest{ns}/none").status == 404


def test_requests_arriving_together_share_one_resolution(cluster: ThreadCluster,
                                                         client: Client, ns: str) -> None:
    record(client, f"{ns}/ds", count=50)
    cache = service_of(cluster).snapshots
    made = cache.resolutions

    async def storm() -> set[bytes]:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            async def one() -> bytes:
                async with session.get(f"{cluster.meta_url}/v1/manifest{ns}/ds",
                                       headers={"Accept-Encoding": "gzip"}) as resp:
                    assert resp.status == 200
                    return await resp.read()
            return set(await asyncio.gather(*(one() for _ in range(64))))

    bodies = asyncio.run(storm())
    assert len(bodies) == 1                         # the same cached bytes for all 64
    assert cache.resolutions == made + 1


async def test_a_target_moving_changes_the_answer(tmp_path: Path) -> None:
    """The locations in a cached answer follow a target that registers at a new URL."""
    service = MetaService(SQLiteStore(tmp_path / "meta.sqlite3"), Config())
    try:
        await service.register_target(TargetInfo("t0", "n0", "http://127.0.0.1:1"))
        layout = Layout(chunk_size=1 << 20, stripe_count=1, replicas=1, targets=("t0",),
                        nodes=("n0",))
        await service.store.begin_uploads([Upload("a" * 32, "/ds/f", layout, True, True, 1.0)])
        await service.store.commit_uploads([("a" * 32, 1, (5,), 1.0)], now=1.0)
        await service.put_manifest("/ds", {"files": [
            {"path": "f", "size": 1, "mtime": 1.0, "file_id": "a" * 32}]})
        first = await service.get_manifest("/ds")
        assert json.loads(first.json_bytes())["locations"] == {"t0": "http://127.0.0.1:1"}
        assert await service.get_manifest("/ds") is first
        await service.register_target(TargetInfo("t0", "n0", "http://127.0.0.1:2"))
        moved = await service.get_manifest("/ds")
        assert moved.etag != first.etag
        assert json.loads(moved.json_bytes())["locations"] == {"t0": "http://127.0.0.1:2"}
    finally:
        service.close()


def test_an_older_sqlite_database_gains_the_gen_column(tmp_path: Path) -> None:
    path = tmp_path / "meta.sqlite3"
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE manifests (dir_id INTEGER PRIMARY KEY, body BLOB NOT NULL, "
                "created REAL NOT NULL)")
    old.close()
    store = SQLiteStore(path)
    store.close()
    columns = [r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(manifests)")]
    assert columns == ["dir_id", "body", "created", "gen"]


@pytest.fixture
def two_metas(tmp_path: Path, pg_url: str) -> Iterator[ProcessCluster]:
    with ProcessCluster(tmp_path / "c", data_servers=2, meta_store=pg_url,
                        meta_servers=2) as two:
        yield two


def _urls(client: Client) -> list[tuple[str, str]]:
    return sorted((t.id, t.url) for t in client.targets())


def test_a_commit_through_one_server_is_seen_through_the_other(
        two_metas: ProcessCluster) -> None:
    a, b = (Client(url) for url in two_metas.meta_urls)
    try:
        record(a, "/ds")
        assert stale(a, "/ds") == [] and stale(b, "/ds") == []      # both cached
        # The ETag names the targets' URLs too: the second server learns of the data
        # servers (which beat to one of them) from the store, a moment later.
        deadline = time.monotonic() + 10
        while _urls(a) != _urls(b) and time.monotonic() < deadline:
            time.sleep(0.1)
        etags = {raw_http(url, "GET", "/v1/manifest/ds").headers["ETag"]
                 for url in two_metas.meta_urls}
        assert len(etags) == 1                      # one store, one version: one ETag
        a.pipe("/ds/sub/f0", b"changed")            # through the first
        assert stale(b, "/ds") == ["sub/f0"]        # seen through the second
        b.rm("/ds/sub/f1")
        assert stale(a, "/ds") == ["sub/f0", "sub/f1"]
        [etag] = etags
        for url in two_metas.meta_urls:
            again = raw_http(url, "GET", "/v1/manifest/ds", headers={"If-None-Match": etag})
            assert again.status == 200
    finally:
        a.close()
        b.close()


async def test_the_cache_keeps_its_budget_least_recently_used_out() -> None:
    cache = SnapshotCache(budget=250)
    made: list[str] = []

    def maker(etag: str, size: int) -> Callable[[], Awaitable[Snapshot]]:
        async def make() -> Snapshot:
            made.append(etag)
            return Snapshot(etag, b"x" * size, size)
        return make

    for path in ("/a", "/b"):
        await cache.get(path, f"{path}1", maker(f"{path}1", 100))
    await cache.get("/a", "/a1", maker("/a1", 100))               # a hit: /a is the newest
    await cache.get("/c", "/c1", maker("/c1", 100))               # over budget: /b goes
    assert cache.peek("/a1") and cache.peek("/c1") and cache.peek("/b1") is None
    await cache.get("/a", "/a2", maker("/a2", 100))               # a new version replaces
    assert cache.peek("/a1") is None and cache.peek("/a2")
    await cache.get("/d", "/d1", maker("/d1", 300))               # larger than the budget
    assert cache.peek("/d1") is None and cache.peek("/a2") and cache.peek("/c1")
    assert made == ["/a1", "/b1", "/c1", "/a2", "/d1"] and cache.resolutions == 5
    assert cache.hits == 1
