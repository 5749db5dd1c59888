"""A quota's use of an attached directory's files, at the store, on each store (issue 28
item 2: "cached bytes of an attached directory count against its quota").

A cached file counts one file and its filled bytes: its commit charges 0 bytes, each
recorded fill its chunk (refused past a limit, recording nothing), and an eviction, a
rename out, an overwrite (by a written file, or by a refresh's new version), a remove
or a detach takes its filled bytes off, never its listed size.  A quota set anew
counts the same from the rows.  ``tests/test_cache_quota.py`` shows the service side.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import STORES

from stager.errors import QuotaExceeded
from stager.meta.store.base import MetaStore, NodeEntry
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.meta.store.sqlite.store import SQLiteStore
from stager.testing.cachestore import attachment, cached
from stager.testing.metastore import LAYOUT, commit_one, upload

CACHED = replace(LAYOUT, cached=True)


@pytest.fixture(params=STORES)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MetaStore]:
    s: MetaStore = (SQLiteStore(tmp_path / "meta.sqlite3") if request.param == "sqlite" else
                    PostgreSQLStore(request.getfixturevalue("postgres").create_database()))
    yield s
    s.close()


async def put_cached(store: MetaStore, name: str, size: int, version: str = "") -> str:
    """A file of the attachment ``/q/lake`` listed at ``size`` bytes: its id."""
    u = replace(upload(name + version, f"/q/lake/{name}"), layout=CACHED)
    await store.begin_uploads([u])
    await store.put_cached_files([cached(u.file_id, "/q/lake", name)])
    assert isinstance(await commit_one(store, u.file_id, size=size), NodeEntry)
    return u.file_id


async def fill(store: MetaStore, file_id: str, index: int, size: int) -> None:
    assert await store.take_fill(file_id, index, "h", until=100.0, now=1.0)
    assert await store.record_fill(file_id, index, size=size, crc=1, now=1.0)


async def use(store: MetaStore) -> tuple[int, int]:
    [q] = [q for q in await store.list_quotas() if q.path == "/q"]
    recounted = await store.set_quota("/q", max_bytes=q.bytes, max_files=q.files)
    assert (recounted.used_bytes, recounted.used_files) == (q.used_bytes, q.used_files)
    return q.used_bytes, q.used_files


async def test_a_cached_file_counts_its_filled_bytes_from_fill_to_its_going(
        store: MetaStore) -> None:
    await store.mkdir("/q/lake", parents=True, exist_ok=False, now=1.0)
    await store.mkdir("/out", parents=False, exist_ok=False, now=1.0)
    await store.put_attachment(attachment("/q/lake"))
    await store.set_quota("/q", max_bytes=100, max_files=None)
    a, b = await put_cached(store, "a", 80), await put_cached(store, "b", 80)
    assert await use(store) == (0, 2)                       # listed: nothing filled
    await fill(store, a, 0, 30)
    await fill(store, a, 1, 30)
    assert await use(store) == (60, 2)
    assert await store.take_fill(b, 0, "h", until=100.0, now=1.0)
    with pytest.raises(QuotaExceeded) as refused:
        await store.record_fill(b, 0, size=50, crc=1, now=1.0)
    assert refused.value.details == {"path": "/q/lake/b", "directory": "/q",
                                     "resource": "bytes", "limit": 100, "use": 60}
    assert await store.filled_chunks(b, [0]) == {}          # nothing of it recorded
    await fill(store, b, 0, 40)                             # up to the limit
    assert await use(store) == (100, 2)
    await store.evict_chunks([(a, 0)])
    assert await use(store) == (70, 2)
    await store.rename("/q/lake/a", "/out/a", overwrite=False, now=2.0)
    assert await use(store) == (40, 1)                      # a's 30 left with it
    w = upload("w", "/q/lake/b")                            # a written file replaces b
    await store.begin_uploads([w])
    assert isinstance(await commit_one(store, w.file_id, size=10), NodeEntry)
    assert await use(store) == (10, 1)                      # b's 40 off, not its 80
    await store.remove("/q/lake/b", recursive=False, now=3.0)
    assert await use(store) == (0, 0)
    c = await put_cached(store, "c", 80)
    await fill(store, c, 0, 30)
    assert await use(store) == (30, 1)
    c2 = await put_cached(store, "c", 90, version="2")      # refreshed: a new version
    await store.drop_cached_files([c])
    assert await use(store) == (0, 1)
    await fill(store, c2, 0, 20)
    assert await use(store) == (20, 1)
    await store.drop_attachment("/q/lake")                  # detached: its fills go
    assert await use(store) == (0, 1)
    await store.remove("/q/lake", recursive=True, now=4.0)
    assert await use(store) == (0, 0)
