"""A small file's joined put on PostgreSQL (``stager_put``, schema 17) writes no upload
row where its commit succeeds: migration 16 inserted one, read it back and deleted it
in the same statement.  Where the commit is refused the row is there after all, as
after a begin and a failed commit, on both stores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg
from test_pg_joined_put import _together, _upload
from test_pg_roundtrips import on_both_stores

from stager.errors import StagerError
from stager.meta.store.base import MetaStore, NodeEntry
from stager.meta.store.postgres.store import PostgreSQLStore

# Every row ever inserted into ``uploads``, counted by a trigger of the test's own.
_COUNT_UPLOAD_ROWS = """
CREATE TABLE upload_rows (n BIGINT NOT NULL);
INSERT INTO upload_rows VALUES (0);
CREATE FUNCTION count_upload_row() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    UPDATE upload_rows SET n = n + 1;
    RETURN NEW;
END
$fn$;
CREATE TRIGGER counted AFTER INSERT ON uploads FOR EACH ROW EXECUTE FUNCTION count_upload_row();
"""


async def _upload_rows(store: PostgreSQLStore) -> int:
    return int(await store.db.read(lambda c: c.fetchval("SELECT n FROM upload_rows")))


async def test_a_joined_put_that_commits_writes_no_upload_row(pg_url: str) -> None:
    store = PostgreSQLStore(pg_url, pool_size=1)
    try:
        await store.mkdir("/a", parents=False, exist_ok=False, now=1.0)
        await store.put_manifest("/a", b"{}", now=1.0)
        await store.db.statement(lambda c: c.execute(_COUNT_UPLOAD_ROWS))
        gen = (await store.manifest_version("/a")).gen
        for i, (size, sums) in enumerate([(0, ()), (1024, (5,))]):
            u = _upload(f"d{i}", f"/a/b/f{i}")
            begun, entry = await _together(store, u, size, sums)
            assert begun is None and isinstance(entry, NodeEntry)
            assert (entry.path, entry.size, entry.checksums) == (u.path, size, sums)
            assert (await store.stat(u.path)).file_id == u.file_id
        assert await _upload_rows(store) == 0      # fails at schema 16: one a put
        assert (await store.manifest_version("/a")).gen == gen + 2    # bumped by each
        assert store.writes.joined == 2
        # refused: the row is written, pending, as after a begin and a failed commit
        refused = _upload("d9", "/a/b/f0", overwrite=False)
        begun, entry = await _together(store, refused)
        assert begun is None and isinstance(entry, StagerError)
        assert await _upload_rows(store) == 1
        assert await store.get_uploads([refused.file_id]) == [refused]
        assert (await store.manifest_version("/a")).gen == gen + 2    # nothing committed
    finally:
        store.close()


async def _over_quota(store: MetaStore) -> list[Any]:
    """A joined put refused by a quota: its upload goes to the garbage (its chunk is
    collected), as a commit refused so does; one within the quota goes through."""
    await store.mkdir("/q", parents=False, exist_ok=False, now=1.0)
    await store.set_quota("/q", max_bytes=1000, max_files=None)
    out: list[Any] = []
    for u, size in [(_upload("q1", "/q/big"), 2000), (_upload("q2", "/q/small"), 10)]:
        begun, entry = await _together(store, u, size, (1,))
        if isinstance(entry, StagerError):
            out.append((begun, type(entry).__name__, entry.details))
        else:
            out.append((begun, "ok", entry.path, entry.size))
        out.append((await store.get_uploads([u.file_id]) == [u], await store.retired(u.file_id)))
    out.append([(q.path, q.used_bytes, q.used_files) for q in await store.list_quotas()])
    return out


async def test_a_joined_put_over_a_quota_answers_as_on_sqlite(pg_url: str,
                                                              tmp_path: Path) -> None:
    sqlite, pg = await on_both_stores(pg_url, tmp_path, _over_quota)
    assert pg == sqlite
    assert pg[0][1] == "QuotaExceeded" and pg[1] == (False, True)     # gone to the garbage
    assert pg[2][1] == "ok" and pg[-1] == [("/q", 10, 1)]


async def test_a_database_set_back_to_schema_16_gets_the_direct_put(pg_url: str) -> None:
    """Migration 17 runs again over its own result (a database set back, as tests do),
    and over migration 16's stager_put (run again from further back)."""
    store = PostgreSQLStore(pg_url, pool_size=1)
    try:
        await store.mkdir("/m", parents=False, exist_ok=False, now=1.0)
    finally:
        store.close()
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("UPDATE stager_schema SET version = 15; " + _COUNT_UPLOAD_ROWS)
    finally:
        await conn.close()
    again = PostgreSQLStore(pg_url, pool_size=1)
    try:
        u = _upload("m1", "/m/f")
        begun, entry = await _together(again, u)
        assert begun is None and isinstance(entry, NodeEntry)
        assert await _upload_rows(again) == 0
    finally:
        again.close()
