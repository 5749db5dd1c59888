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

from stager import Client
from stager.config import load_config
from stager.errors import AlreadyExists
from stager.meta.http.app import SERVICE
from stager.meta.service import MetaService
from stager.meta.store.sqlite.store import SQLiteStore
from stager.meta.store.sqlite.thread import StoreThread
from stager.protocol.batch import CommitItem, CreateItem, one
from stager.protocol.models import TargetInfo
from stager.testing import ThreadCluster


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


async def watch_upload_rows(service: MetaService) -> None:
    """Record every row inserted into ``uploads`` in ``seen_uploads`` (a trigger)."""
    def install() -> None:
        db = store_thread_db(service)
        db.execute("CREATE TABLE IF NOT EXISTS seen_uploads (file_id TEXT)")
        db.execute("CREATE TRIGGER IF NOT EXISTS watch AFTER INSERT ON uploads "
                   "BEGIN INSERT INTO seen_uploads VALUES (NEW.file_id); END")

    await store_thread(service).run(install)


def store_thread_db(service: MetaService):  # type: ignore[no-untyped-def]
    assert isinstance(service.store, SQLiteStore)
    return service.store.database.db


async def seen_upload_rows(service: MetaService) -> list[str]:
    return [r[0] for r in await store_thread(service).run(
        lambda: store_thread_db(service).execute("SELECT file_id FROM seen_uploads").fetchall())]


async def put_as_the_gateway(service: MetaService, path: str, *, overwrite: bool = True
                             ) -> object:
    """A small PUT's store calls as Gateway makes them: the upload's record and its
    commit, two tasks one after the other (the record left until the chunk is
    stored); the commit's outcome, the record's error first."""
    [(upload, _)], fresh = await service.plan_creates([CreateItem(path, overwrite=overwrite)])
    begun = asyncio.ensure_future(service.begin_uploads(fresh))
    committed = asyncio.ensure_future(service.commit([CommitItem(upload.file_id, 0, ())]))
    await begun
    return (await committed)[0]


async def test_a_small_put_never_writes_its_upload_row(tmp_path: Path) -> None:
    service = await make_service(tmp_path)
    try:
        await watch_upload_rows(service)
        thread = store_thread(service)
        joined = thread.joined
        infos = [await put_as_the_gateway(service, f"/j/f{i}") for i in range(3)]
        assert [i.path for i in infos] == [f"/j/f{i}" for i in range(3)]  # type: ignore[attr-defined]
        assert thread.joined == joined + 3
        assert await seen_upload_rows(service) == []        # recorded and committed as one
        assert (await service.stat("/j/f1")).size == 0
    finally:
        service.close()


async def test_a_joined_commit_that_fails_leaves_its_upload_pending(tmp_path: Path) -> None:
    """Its record is made after all (as after a record and a failed commit): its writer
    aborts it, and its chunks are collected."""
    service = await make_service(tmp_path)
    try:
        await watch_upload_rows(service)
        [(first, _)], fresh = await service.plan_creates([CreateItem("/j/x", overwrite=False)])
        await put_as_the_gateway(service, "/j/x")           # the path taken meanwhile
        begun = asyncio.ensure_future(service.begin_uploads(fresh))
        committed = asyncio.ensure_future(service.commit([CommitItem(first.file_id, 0, ())]))
        await begun
        [result] = await committed
        assert isinstance(result, AlreadyExists)
        assert await seen_upload_rows(service) == [first.file_id]
        assert one(await service.store.get_uploads([first.file_id])).path == "/j/x"
        assert await service.abort([first.file_id]) == [None]
        garbage = await service.store.take_garbage(10)
        assert first.file_id in [g.file_id for g in garbage]
    finally:
        service.close()


def test_a_gateway_put_of_a_small_file_is_one_store_call(tmp_path: Path) -> None:
    """Through the HTTP gateway of a real cluster (servers on loopback): a small PUT's
    record and commit run joined, and write no uploads row."""
    with ThreadCluster(tmp_path / "c", data_servers=1) as cluster:
        assert cluster.meta is not None
        service = cluster.meta.app[SERVICE]
        cluster.call(watch_upload_rows(service))
        thread = store_thread(service)
        joined, client = thread.joined, Client(cluster.meta_url)
        for i in range(6):
            client.pipe(f"/g/f{i}", b"g" * 1024)
        # a look for quotas (at most once a second) may come between a record and its
        # commit, which then run apart, the record writing its row
        ran_joined = thread.joined - joined
        assert ran_joined >= 4
        assert len(cluster.call(seen_upload_rows(service))) == 6 - ran_joined
        assert all(client.cat(f"/g/f{i}") == b"g" * 1024 for i in range(6))
