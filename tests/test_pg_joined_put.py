"""A small file's upload record and its commit, queued together (as the gateway's PUT
queues them on an ``in_order`` store), run on PostgreSQL as one statement
(``stager_put``, schema 16) that answers as the two would."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from test_pg_roundtrips import on_both_stores

from stager import Client
from stager.client.async_client import SMALL_FILE
from stager.errors import StagerError
from stager.meta.http.app import SERVICE
from stager.meta.store.base import MetaStore, NodeEntry, Upload
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.protocol.models import LayoutSpec
from stager.testing import ThreadCluster
from stager.testing.metastore import LAYOUT


async def watched(store: PostgreSQLStore) -> list[str]:
    """The statements, whole, the store's connections send from now on (pool_size=1)."""
    seen: list[str] = []
    for serializable in (False, True):
        pool = await store.db.pool(serializable)
        async with pool.acquire() as conn:
            conn.add_query_logger(lambda q: seen.append(" ".join(q.query.split())))
    return seen


def _upload(file_id: str, path: str, *, overwrite: bool = True, parents: bool = True
            ) -> Upload:
    return Upload(file_id.ljust(32, "0"), path, LAYOUT, overwrite, parents, 1.0)


async def _together(store: MetaStore, u: Upload, size: int = 0,
                    checksums: tuple[int, ...] = ()) -> tuple[Any, Any]:
    """Begin ``u`` and commit it right behind, as the gateway does; both outcomes."""
    begun = asyncio.ensure_future(store.begin_uploads([u]))
    committed = asyncio.ensure_future(store.commit_uploads(
        [(u.file_id, size, checksums, 2.0, {})], now=2.0))
    out = await asyncio.gather(begun, committed, return_exceptions=True)
    return out[0], out[1][0] if isinstance(out[1], list) else out[1]


async def test_a_begin_and_its_commit_queued_together_are_one_statement(pg_url: str) -> None:
    store = PostgreSQLStore(pg_url, pool_size=1)
    try:
        assert store.in_order
        await store.mkdir("/a", parents=False, exist_ok=False, now=1.0)
        await store.put_manifest("/a", b"{}", now=1.0)
        gen = (await store.manifest_version("/a")).gen
        seen = await watched(store)
        u = _upload("p1", "/a/b/c")
        begun, entry = await _together(store, u, 1, (7,))
        assert begun is None and isinstance(entry, NodeEntry)
        assert len(seen) == 1 and "stager_put(" in seen[0], seen
        assert (entry.path, entry.size, entry.checksums, entry.file_id) == (
            "/a/b/c", 1, (7,), u.file_id)
        assert (await store.stat("/a/b/c")).file_id == u.file_id
        assert await store.get_uploads([u.file_id]) != [u]          # no longer pending
        assert (await store.manifest_version("/a")).gen > gen       # bumped as a commit does
    finally:
        store.close()


async def _outcomes(store: MetaStore) -> list[Any]:
    """Begin-and-commit pairs that fail in each way a commit can, then ones that
    succeed; after a failure the upload is pending, as after a commit alone."""
    await store.mkdir("/d", parents=False, exist_ok=False, now=1.0)
    await _together(store, _upload("f", "/f"))
    cases = [_upload("x1", "/f/x"), _upload("x2", "/d"), _upload("x3", "/f", overwrite=False),
             _upload("x4", "/m/n/o", parents=False), _upload("x5", "/p/q", parents=False),
             _upload("x6", "/f")]
    out: list[Any] = []
    for u in cases:
        begun, entry = await _together(store, u, 2, (3,))
        if isinstance(entry, StagerError):
            assert await store.get_uploads([u.file_id]) == [u]      # still pending
            out.append((begun, type(entry).__name__, entry.message, entry.details))
        else:
            out.append((begun, "ok", entry.path, entry.size, entry.checksums))
    out.append([(e.path, e.kind, e.file_id) for e in await store.list_dir("/", after="",
                                                                          limit=100)])
    return out


async def test_a_joined_put_answers_as_on_sqlite(pg_url: str, tmp_path: Path) -> None:
    sqlite, pg = await on_both_stores(pg_url, tmp_path, _outcomes)
    assert pg == sqlite
    assert [o[1] for o in pg[:6]] == ["AlreadyExists", "IsADirectory", "AlreadyExists",
                                      "NotFound", "ok", "ok"]


async def test_a_pending_id_is_not_joined_over(pg_url: str) -> None:
    """An id already pending (another try's upload) fails the pair, as a begin of it
    fails, and the pending upload stays as it was."""
    store = PostgreSQLStore(pg_url, pool_size=1)
    try:
        first = _upload("dup", "/one")
        await store.begin_uploads([first])
        again = Upload(first.file_id, "/two", LAYOUT, True, True, 5.0)
        begun, entry = await _together(store, again)
        assert isinstance(begun, Exception) and isinstance(entry, Exception)
        assert await store.get_uploads([first.file_id]) == [first]
    finally:
        store.close()


def test_a_small_gateway_put_joins_its_record_and_commit(pg_url: str, tmp_path: Path,
                                                         ns: str) -> None:
    """Through a real metadata server on PostgreSQL: a small PUT (0 B and one chunk)
    records its upload with its commit, in one statement (a look for quotas, once a
    second, may come between the two of one put); a larger file, written through a
    create, its chunks and a commit (three requests), is not joined."""
    with ThreadCluster(tmp_path, data_servers=1, meta_store=pg_url) as cluster:
        assert cluster.meta is not None
        store = cluster.meta.app[SERVICE].store
        assert isinstance(store, PostgreSQLStore)
        client, puts = Client(cluster.meta_url), 8
        try:
            before = store.writes.joined
            for i in range(puts):
                client.pipe(f"{ns}/e{i}", b"")
                client.pipe(f"{ns}/s{i}", b"s" * 1024)
            assert store.writes.joined - before >= puts
            assert all(client.cat(f"{ns}/s{i}") == b"s" * 1024 and client.cat(f"{ns}/e{i}")
                       == b"" for i in range(puts))
            before = store.writes.joined
            big = bytes(SMALL_FILE + 1)
            client.pipe(f"{ns}/big", big, layout=LayoutSpec(chunk_size=1 << 20))
            assert store.writes.joined == before and client.cat(f"{ns}/big") == big
            assert cluster.call(store.expired_uploads(float("inf"))) == []
        finally:
            client.close()
