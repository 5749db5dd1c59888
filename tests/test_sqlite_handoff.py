"""The SQLite store thread takes the calls of one pass of the event loop in one
hand-off (stager/meta/store/sqlite/thread.py): a small PUT's upload record and its
commit, made by two tasks one after the other, share one wake-up and one
transaction even when the thread was idle and woke between them.

Real SQLite on disk, the real MetaService and StoreThread; no HTTP.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from stager.config import load_config
from stager.meta.service import MetaService
from stager.meta.store.sqlite.store import SQLiteStore
from stager.meta.store.sqlite.thread import StoreThread
from stager.protocol.batch import CommitItem, CreateItem, one
from stager.protocol.models import TargetInfo


async def make_service(root: Path) -> MetaService:
    service = MetaService(SQLiteStore(root / "meta.sqlite3"), load_config(env={}))
    await service.start()
    await service.register_target(TargetInfo("t0", "node0", "http://127.0.0.1:1"))
    return service


def store_thread(service: MetaService) -> StoreThread:
    assert isinstance(service.store, SQLiteStore)
    return service.store.thread


async def test_a_record_and_its_commit_share_one_handoff_on_an_idle_thread(
        tmp_path: Path) -> None:
    service = await make_service(tmp_path)
    try:
        thread = store_thread(service)
        for i in range(5):
            [(upload, _)], fresh = await service.plan_creates([CreateItem(f"/h/f{i}")])
            assert fresh == [upload]
            await asyncio.sleep(0.01)           # the thread idle, waiting on its queue
            groups, handoffs = thread.groups, thread.handoffs

            async def commit_late(file_id: str = upload.file_id) -> object:
                # the commit comes a moment after the record, in the same pass (the
                # gateway's two tasks): an idle thread used to take the record alone
                time.sleep(0.005)
                return one(await service.commit([CommitItem(file_id, 0, ())]))

            begun = asyncio.ensure_future(service.begin_uploads(fresh))
            committed = asyncio.ensure_future(commit_late())
            await begun
            info = await committed
            assert info.path == f"/h/f{i}"      # type: ignore[attr-defined]
            assert thread.handoffs == handoffs + 1
            assert thread.groups == groups + 1  # the record and the commit: one transaction
    finally:
        service.close()
    reopened = SQLiteStore(tmp_path / "meta.sqlite3")
    try:
        assert [e.path for e in await reopened.list_dir("/h", after="", limit=10)] == [
            f"/h/f{i}" for i in range(5)]
    finally:
        reopened.close()


async def test_calls_made_before_close_still_run(tmp_path: Path) -> None:
    """A call queued in the pass that closes the store is run, not left waiting."""
    service = await make_service(tmp_path)
    thread = store_thread(service)
    job = asyncio.ensure_future(service.store.begin_uploads([]))
    await asyncio.sleep(0)                      # the call is made, its pass not ended
    assert thread._outbox
    service.close()
    await asyncio.wait_for(job, 5)
