"""Both metadata stores against the metadata store's conformance suite."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from stager.meta.store.base import MetaStore, NodeEntry
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.meta.store.sqlite.store import SQLiteStore
from stager.testing.cachestore import CacheStoreTests, attachment, cached
from stager.testing.metastore import MetaStoreTests, commit_one, upload
from stager.testing.quotastore import QuotaStoreTests
from stager.testing.s3keystore import S3KeyStoreTests


class TestMetaStore(MetaStoreTests, QuotaStoreTests, CacheStoreTests, S3KeyStoreTests):
    @pytest.fixture(params=["sqlite", "postgresql"])
    def open_store(self, request: pytest.FixtureRequest,
                   tmp_path: Path) -> Callable[[], MetaStore]:
        if request.param == "sqlite":
            return lambda: SQLiteStore(tmp_path / "meta.sqlite3")
        url = request.getfixturevalue("pg_url")
        return lambda: PostgreSQLStore(url)


async def test_sqlite_flushes_every_commit_but_a_lone_upload_or_answer(tmp_path: Path) -> None:
    """A pending upload or a recorded answer alone commits without an fsync
    (synchronous=NORMAL); everything else, and those in a group, with one (FULL):
    the setting is back to FULL after each, and the rows are there."""
    store = SQLiteStore(tmp_path / "meta.sqlite3")
    try:
        def synchronous() -> int:
            return int(store.database.db.execute("PRAGMA synchronous").fetchone()[0])

        assert synchronous() == 2                               # FULL
        u = upload("s1", "/s1")
        await store.begin_uploads([u])
        assert await store.record_answer("k", 200, b"{}", now=1.0)
        assert synchronous() == 2
        assert await store.get_uploads([u.file_id]) == [u]
        assert await store.recorded_answer("k") == (200, b"{}")
        seen: list[int] = []
        store.database.db.set_trace_callback(
            lambda q: seen.append(1) if "synchronous=NORMAL" in q else None)
        assert isinstance(await commit_one(store, u.file_id), NodeEntry)
        await store.mkdir("/d", parents=False, exist_ok=False, now=1.0)
        assert seen == [] and synchronous() == 2
    finally:
        store.close()


async def test_a_sqlite_file_made_before_the_cache_gets_its_tables(tmp_path: Path) -> None:
    path = tmp_path / "meta.sqlite3"
    SQLiteStore(path).close()
    with sqlite3.connect(path) as db:
        db.executescript("DROP TABLE attachments; DROP TABLE cached_files; "
                         "DROP TABLE cache_chunks;")
    store = SQLiteStore(path)
    try:
        await store.put_attachment(attachment("/a"))
        await store.put_cached_files([cached("f".ljust(32, "0"), "/a", "x")])
        assert await store.take_fill("f".ljust(32, "0"), 0, "s1", until=2.0, now=1.0)
        assert [a.path for a in await store.attachments()] == ["/a"]
    finally:
        store.close()
