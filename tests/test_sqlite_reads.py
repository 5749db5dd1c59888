"""The SQLite store answers a stat on the event loop, through a reader connection of
its own (issue 30): it never queues behind the store thread, and it sees every commit
the writer has acknowledged, as one snapshot."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from stager.errors import NotFound
from stager.meta.store.sqlite.store import SQLiteStore


async def test_stat_does_not_wait_for_the_store_thread(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "meta.db")
    try:
        await store.mkdir("/a/b", parents=True, exist_ok=False, now=1.0)
        release = threading.Event()
        # the store thread busy (a long write, an fsync): a stat still answers
        held = asyncio.ensure_future(store.thread.run(release.wait, 10))
        await asyncio.sleep(0.05)
        entry = await asyncio.wait_for(store.stat("/a/b"), 2)
        assert (entry.path, entry.kind) == ("/a/b", "directory")
        release.set()
        await held
    finally:
        store.close()


async def test_stat_sees_each_acknowledged_write(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "meta.db")
    try:
        for i in range(20):
            await store.mkdir(f"/d{i}", parents=False, exist_ok=False, now=float(i))
            assert (await store.stat(f"/d{i}")).mtime == float(i)
        await store.rename("/d0", "/e0", overwrite=False, now=30.0)
        try:
            await store.stat("/d0")
            raise AssertionError("a renamed path still stats")
        except NotFound:
            pass
        assert (await store.stat("/e0")).path == "/e0"
    finally:
        store.close()


async def test_stat_falls_back_to_the_thread_when_the_reader_cannot(tmp_path: Path) -> None:
    """The reader closed under a stat (the store shutting down around it) is not a 500:
    the store thread answers while it still runs."""
    store = SQLiteStore(tmp_path / "meta.db")
    try:
        await store.mkdir("/x", parents=False, exist_ok=False, now=1.0)
        store.database.reader.close()
        assert (await store.stat("/x")).path == "/x"
    finally:
        store.thread.close()
        store.database.db.close()
