"""Group commit on the metadata store thread, and batches at the service level.

Real SQLite on disk, the real MetaService; no HTTP.  Writes that queue up while
the store thread is busy share one transaction; each still fails alone, and what
was acknowledged is on disk when the store is opened again.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from stager.config import load_config
from stager.errors import AlreadyExists, IsADirectory, NotFound, UploadNotFound
from stager.meta.service import MetaService
from stager.meta.store.sqlite.store import SQLiteStore
from stager.meta.store.sqlite.thread import StoreThread
from stager.protocol.batch import CommitItem, CreateItem, one
from stager.protocol.models import TargetInfo


async def make_service(root: Path) -> MetaService:
    service = MetaService(SQLiteStore(root / "meta.sqlite3"), load_config(env={}))
    await service.start()
    for i in range(3):
        await service.register_target(TargetInfo(f"t{i}", f"node{i}", f"http://127.0.0.1:{i + 1}"))
    return service


def store_thread(service: MetaService) -> StoreThread:
    assert isinstance(service.store, SQLiteStore)
    return service.store.thread


async def hold(service: MetaService) -> threading.Event:
    """Keep the store thread busy until the returned event is set, so that the calls
    made meanwhile queue up behind it."""
    release, started = threading.Event(), threading.Event()

    def busy() -> None:
        started.set()
        release.wait(10)

    asyncio.ensure_future(store_thread(service).run(busy))
    await asyncio.to_thread(started.wait, 10)
    return release


def commit(service: MetaService, file_id: str) -> asyncio.Future[object]:
    """The store write of a commit of one (what MetaService.commit does after its
    checks): its one result, the entry or the error."""
    async def commit_one() -> object:
        [result] = await service.store.commit_uploads([(file_id, 0, (), 1.0)], now=1.0)
        return result

    return asyncio.ensure_future(commit_one())


async def test_queued_writes_share_one_transaction_and_fail_alone(tmp_path: Path) -> None:
    service = await make_service(tmp_path)
    try:
        await service.mkdir("/g", parents=True)
        taken = [one(await service.create([CreateItem(f"/g/taken{i}")])) for i in range(2)]
        clash = [one(await service.create([CreateItem(f"/g/taken{i}", overwrite=False)]))
                 for i in range(2)]
        for upload, _ in taken:
            one(await service.commit([CommitItem(upload.file_id, 0, ())]))
        uploads = [one(await service.create([CreateItem(f"/g/f{i}")])) for i in range(20)]
        groups_before = store_thread(service).groups
        release = await hold(service)
        jobs = [commit(service, u.file_id) for u, _ in [*uploads[:10], *clash, *uploads[10:]]]
        jobs.append(commit(service, "0" * 32))
        await asyncio.sleep(0.05)
        release.set()
        results = await asyncio.gather(*jobs)
        assert store_thread(service).groups == groups_before + 1      # one transaction
        assert store_thread(service).grouped_calls >= len(jobs)
        assert [type(r) for r in results[10:12]] == [AlreadyExists, AlreadyExists]
        assert isinstance(results[-1], UploadNotFound)
        ok = results[:10] + results[12:-1]
        assert [r.path for r in ok] == [f"/g/f{i}" for i in range(20)]  # type: ignore[attr-defined]
        # the failed commits changed nothing: their uploads are still pending
        for upload, _ in clash:
            assert one(await service.store.get_uploads([upload.file_id])).path
    finally:
        service.close()
    reopened = SQLiteStore(tmp_path / "meta.sqlite3")
    try:
        assert [e.path for e in await reopened.list_dir("/g", after="", limit=100)] == sorted(
            [f"/g/f{i}" for i in range(20)] + ["/g/taken0", "/g/taken1"])
    finally:
        reopened.close()


async def test_a_read_ends_a_group_and_sees_the_writes_before_it(tmp_path: Path) -> None:
    service = await make_service(tmp_path)
    try:
        first, _ = one(await service.create([CreateItem("/r/f")]))
        second, _ = one(await service.create([CreateItem("/r/g")]))
        release = await hold(service)
        first_commit = commit(service, first.file_id)
        await asyncio.sleep(0.01)
        listing = asyncio.ensure_future(service.list("/r"))
        await asyncio.sleep(0.01)
        second_commit = commit(service, second.file_id)
        await asyncio.sleep(0.01)
        # A stat does not queue on the store thread (it reads on the loop through the
        # reader connection, tests/test_sqlite_reads.py): it answers at once with the
        # last commit, which is not yet the held one.
        with pytest.raises(NotFound):
            await service.stat("/r/f")
        groups_before = store_thread(service).groups
        release.set()
        assert [e.path for e in (await listing)[0]] == ["/r/f"]
        assert [(await first_commit).path, (await second_commit).path  # type: ignore[attr-defined]
                ] == ["/r/f", "/r/g"]
        assert store_thread(service).groups == groups_before      # none: each ran alone
        assert (await service.stat("/r/f")).file_id == first.file_id
    finally:
        service.close()


async def test_a_batch_does_what_a_batch_of_one_does(tmp_path: Path) -> None:
    service = await make_service(tmp_path)
    try:
        await service.mkdir("/b/dir", parents=True)
        single, _ = one(await service.create([CreateItem("/b/single")]))
        one(await service.commit([CommitItem(single.file_id, 0, (), 5.0)]))
        created = await service.create([
            CreateItem("/b/n1"), CreateItem("/b/single", overwrite=False), CreateItem("/b/dir"),
            CreateItem("/b/missing/x", parents=False), CreateItem("/"), CreateItem("/b/n2")])
        assert [type(r).__name__ for r in created[1:5]] == [
            "AlreadyExists", "IsADirectory", "NotFound", "IsADirectory"]
        n1, n2 = created[0], created[5]
        assert not isinstance(n1, Exception) and not isinstance(n2, Exception)
        committed = await service.commit([
            CommitItem(n1[0].file_id, 0, (), 7.0), CommitItem(n2[0].file_id, 9, ())])
        assert committed[0].mtime == 7.0                      # type: ignore[union-attr]
        assert "checksums" in str(committed[1])
        assert (await service.stat("/b/single")).mtime == 5.0
        with pytest.raises(NotFound):
            await service.stat("/b/n2")
        aborted = await service.abort([n2[0].file_id, n2[0].file_id.replace("a", "b")
                                            if "a" in n2[0].file_id else "f" * 32])
        assert aborted[0] is None and isinstance(aborted[1], UploadNotFound)
        assert isinstance(created[4], IsADirectory)
    finally:
        service.close()
