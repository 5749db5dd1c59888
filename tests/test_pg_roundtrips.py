"""The PostgreSQL store's round trips: what each call sends (counted on the real
connection), and that the server-side commit (schema 5) answers as the SQLite
store does, changing nothing when it fails."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest

from stager.errors import StagerError
from stager.meta.store.base import MetaStore, NodeEntry, Upload
from stager.meta.store.postgres import uploads as up
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.meta.store.sqlite.store import SQLiteStore
from stager.protocol.models import LayoutSpec
from stager.testing.metastore import LAYOUT, commit_one, upload

T = TypeVar("T")


async def watched(store: PostgreSQLStore) -> list[str]:
    """The statements the store's connections send from now on (pool_size=1: one for
    reads, one for writes)."""
    seen: list[str] = []
    for serializable in (False, True):
        pool = await store.db.pool(serializable)
        async with pool.acquire() as conn:
            conn.add_query_logger(
                lambda q: seen.append(" ".join(q.query.split())[:40].strip()))
    return seen


async def test_create_commit_and_stat_take_one_statement_each(pg_url: str) -> None:
    store = PostgreSQLStore(pg_url, pool_size=1)
    try:
        await store.mkdir("/a", parents=False, exist_ok=False, now=1.0)
        seen = await watched(store)
        u = upload("r1", "/a/b/c")
        assert await store.check_creates([(u.path, True, True)]) == [LayoutSpec()]
        assert len(seen) == 1 and seen[0].startswith("WITH RECURSIVE walk")
        seen.clear()
        await store.begin_uploads([u])              # one, alone: no transaction needed
        assert len(seen) == 1 and seen[0].startswith("SELECT stager_reserve(")
        seen.clear()
        await commit_one(store, u.file_id, size=1, checksums=(7,), mtime=2.0, now=2.0)
        # stager_commit, with the manifests above the file bumped in the same statement,
        # SERIALIZABLE (the writes pool's default) with no BEGIN and COMMIT
        assert seen == ["WITH RECURSIVE target AS ( SELECT string"]
        seen.clear()
        entry = await store.stat("/a/b/c")
        assert len(seen) == 1 and (entry.size, entry.checksums, entry.file_id) == (
            1, (7,), u.file_id)
        assert (await store.stat("/a/b")).is_dir
    finally:
        store.close()


async def test_lazy_commits_do_not_leak_into_the_session(pg_url: str) -> None:
    """A reservation and a recorded answer commit without waiting for the WAL flush;
    the connection then goes back to the pool, and what runs on it next (a commit)
    must wait for it again: the setting lasted only their own transaction."""
    store = PostgreSQLStore(pg_url, pool_size=1)
    try:
        seen = await watched(store)
        u1, u2 = upload("l1", "/l1"), upload("l2", "/l2")
        await store.begin_uploads([u1])
        assert await store.record_answer("k1", 200, b"{}", now=1.0)
        assert not await store.record_answer("k1", 500, b"x", now=2.0)   # the first kept
        assert await store.recorded_answer("k1") == (200, b"{}")
        assert [q.split("(")[0] for q in seen[:2]] == ["SELECT stager_reserve",
                                                        "SELECT stager_record_answer"]
        pool = await store.db.pool(serializable=True)
        async with pool.acquire() as conn:
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
            assert await conn.fetchval("SHOW transaction_isolation") == "serializable"
            async with conn.transaction():
                await up.reserve(conn, u2)
                assert await conn.fetchval("SHOW synchronous_commit") == "off"
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
        assert await store.get_uploads([u1.file_id, u2.file_id]) == [u1, u2]
    finally:
        store.close()


def _upload(file_id: str, path: str, *, overwrite: bool = True,
            parents: bool = True) -> Upload:
    return Upload(file_id.ljust(32, "0"), path, LAYOUT, overwrite, parents, 1.0)


async def _outcomes(store: MetaStore) -> list[Any]:
    """Commits that fail in each way a commit can, then one that makes its parent;
    after each failure the upload is still pending and nothing else changed."""
    await store.mkdir("/d", parents=False, exist_ok=False, now=1.0)
    for file_id, path in [("f", "/f"), ("e", "/e")]:
        u = _upload(file_id, path)
        await store.begin_uploads([u])
        await commit_one(store, u.file_id)
    cases = [_upload("x1", "/f/x"), _upload("x2", "/f/y/z"), _upload("x3", "/d"),
             _upload("x4", "/e", overwrite=False), _upload("x5", "/m/n/o", parents=False),
             _upload("x6", "/p/q", parents=False), _upload("x7", "/s/t/u")]
    out: list[Any] = []
    for u in cases:
        await store.begin_uploads([u])
        entry = await commit_one(store, u.file_id, size=2, checksums=(3,), mtime=4.0, now=4.0)
        if isinstance(entry, StagerError):
            assert await store.get_uploads([u.file_id]) == [u]      # still pending
            out.append((type(entry).__name__, entry.message, entry.details))
        else:
            assert isinstance(entry, NodeEntry)
            out.append(("ok", entry.path, entry.size, entry.checksums, entry.layout))
    gone = await commit_one(store, "0" * 32)
    assert isinstance(gone, StagerError)
    out.append((type(gone).__name__, gone.message, gone.details))
    out.append([(e.path, e.kind) for e in await store.list_dir("/", after="", limit=100)])
    return out


async def on_both_stores(pg_url: str, tmp_path: Path,
                         outcomes: Callable[[MetaStore], Awaitable[T]]) -> list[T]:
    """``outcomes`` of a fresh SQLite store, then of a fresh PostgreSQL one."""
    stores: list[MetaStore] = [SQLiteStore(tmp_path / "meta.sqlite3"), PostgreSQLStore(pg_url)]
    try:
        return [await outcomes(s) for s in stores]
    finally:
        for s in stores:
            s.close()


async def test_a_commit_answers_as_on_sqlite_and_a_failed_one_changes_nothing(
        pg_url: str, tmp_path: Path) -> None:
    sqlite, pg = await on_both_stores(pg_url, tmp_path, _outcomes)
    assert pg == sqlite
    assert [o[0] for o in pg[:8]] == ["AlreadyExists", "NotADirectory", "IsADirectory",
                                      "AlreadyExists", "NotFound", "ok", "ok",
                                      "UploadNotFound"]
    assert pg[-1] == [("/d", "directory"), ("/e", "file"), ("/f", "file"),
                      ("/p", "directory"), ("/s", "directory")]


async def _renames(store: MetaStore) -> list[Any]:
    """Renames that fail in each way one can, and ones that move files and
    directories, replacing what they may; after each, the whole tree."""
    for path in ("/a/b", "/a/empty", "/c/full/x"):
        await store.mkdir(path, parents=True, exist_ok=False, now=1.0)
    for i, path in enumerate(["/a/f", "/a/g", "/c/h", "/a/b/k"]):
        u = _upload(f"r{i}", path)
        await store.begin_uploads([u])
        await commit_one(store, u.file_id, size=i, checksums=(i,) if i else ())
    cases = [("/nope", "/x"), ("/a/f", "/nope/x"), ("/a/f", "/a/g/x"), ("/a/f", "/a/b"),
             ("/a/b", "/a/f"), ("/a/f", "/a/g", False), ("/a/b", "/a/b/k/z"),
             ("/a/b", "/c/full"), ("/a", "/a/b/deeper"), ("/a/f", "/a/f"),
             ("/a/f", "/a/g"), ("/a/b", "/a/empty"), ("/c/h", "/a/empty/h"), ("/c", "/z/c")]
    out: list[Any] = []
    for src, dst, *more in cases:
        try:
            entry = await store.rename(src, dst, overwrite=more[0] if more else True, now=2.0)
            out.append(("ok", entry.path, entry.kind, entry.size, entry.file_id))
        except StagerError as exc:
            out.append((type(exc).__name__, exc.message, exc.details))
    out.append(sorted((p, e.kind, e.size) for p, e in
                      (await store.subtree_files("/")).items()))
    out.append([(e.path, e.kind) for e in await store.list_dir("/a", after="", limit=100)])
    return out


async def test_a_rename_answers_as_on_sqlite_in_five_round_trips(pg_url: str,
                                                                  tmp_path: Path) -> None:
    stores: list[MetaStore] = [SQLiteStore(tmp_path / "meta.sqlite3"),
                               PostgreSQLStore(pg_url, pool_size=1)]
    try:
        sqlite, pg = [await _renames(s) for s in stores]
        assert pg == sqlite
        assert [o[0] for o in pg[:14]] == [
            "NotFound", "NotFound", "NotADirectory", "IsADirectory", "NotADirectory",
            "AlreadyExists", "InvalidPath", "DirectoryNotEmpty", "InvalidPath", "ok", "ok",
            "ok", "ok", "NotFound"]
        store = stores[1]
        assert isinstance(store, PostgreSQLStore)
        seen = await watched(store)
        await store.rename("/a/g", "/a/empty/g2", overwrite=True, now=3.0)
        assert [q.split(" ")[0] for q in seen] == ["BEGIN", "WITH", "WITH", "WITH", "COMMIT;"]
    finally:
        for s in stores:
            s.close()


async def test_a_database_error_in_a_group_runs_it_again_with_savepoints(pg_url: str) -> None:
    """A write of a group that fails with a database error (not ours) aborts the shared
    transaction; the group runs again, each write in a savepoint, and only it fails."""
    store = PostgreSQLStore(pg_url)
    try:
        uploads = [upload(f"q{i:02d}", f"/q/f{i}") for i in range(8)]
        await store.begin_uploads([*uploads, upload("qzz", "/q/pending")])
        again = upload("qzz", "/q/other")          # the same id: a unique violation
        results = await _gathered(
            [lambda u=u: commit_one(store, u.file_id) for u in uploads[:4]]
            + [lambda: store.begin_uploads([again])]
            + [lambda u=u: commit_one(store, u.file_id) for u in uploads[4:]])
        assert isinstance(results[4], asyncpg.UniqueViolationError)
        assert [r.path for r in results[:4] + results[5:]] == [u.path for u in uploads]
        assert store.writes.redone >= 1
        assert len(await store.list_dir("/q", after="", limit=100)) == 8
    finally:
        store.close()


async def _gathered(calls: list[Callable[[], Any]]) -> list[Any]:
    return list(await asyncio.gather(*(c() for c in calls), return_exceptions=True))


async def test_a_lone_begin_may_run_twice_but_never_takes_another_id(pg_url: str) -> None:
    store = PostgreSQLStore(pg_url)
    try:
        u = upload("b1", "/b/one")
        await store.db.statement(lambda c: up.reserve(c, u))
        await store.db.statement(lambda c: up.reserve(c, u))        # a rerun: done
        assert await store.get_uploads([u.file_id]) == [u]
        with pytest.raises(asyncpg.UniqueViolationError):
            await store.db.statement(lambda c: up.reserve(c, upload("b1", "/b/two")))
    finally:
        store.close()
