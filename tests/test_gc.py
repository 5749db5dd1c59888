"""Garbage collection: chunks of removed, replaced and abandoned files leave the disks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest
from conftest import start_cluster

from stager import AsyncClient, Client
from stager.config import load_config
from stager.protocol.models import LayoutSpec
from stager.testing import ThreadCluster

SMALL = 64 * 1024
LAYOUT = LayoutSpec(chunk_size=SMALL, stripe_count=3)


def chunk_files(cluster: ThreadCluster, file_id: str) -> list[str]:
    """Every chunk file of ``file_id`` on every data server's disk."""
    found = []
    for i in range(cluster.n):
        directory = cluster.root / f"data{i}" / "chunks" / file_id[:2] / file_id[2:4]
        if directory.exists():
            found += [p.name for p in directory.iterdir() if p.name.startswith(file_id)]
    return sorted(found)


def eventually(check: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.05)


def test_rm_collects_chunks(client: Client, cluster: ThreadCluster, ns: str, payload) -> None:
    info = client.pipe(f"{ns}/f.bin", payload(SMALL * 5), layout=LAYOUT)
    assert info.file_id is not None
    assert len(chunk_files(cluster, info.file_id)) == 5
    keep = client.pipe(f"{ns}/keep.bin", payload(SMALL * 2), layout=LAYOUT)
    client.rm(f"{ns}/f.bin")
    eventually(lambda: chunk_files(cluster, info.file_id or "") == [])
    assert keep.file_id is not None and len(chunk_files(cluster, keep.file_id)) == 2
    assert client.cat(f"{ns}/keep.bin") == payload(SMALL * 2)


def test_overwrite_collects_the_old_chunks(client: Client, cluster: ThreadCluster, ns: str,
                                           payload) -> None:
    old = client.pipe(f"{ns}/o.bin", payload(SMALL * 4), layout=LAYOUT)
    new = client.pipe(f"{ns}/o.bin", payload(SMALL * 2 + 1), layout=LAYOUT)
    assert old.file_id != new.file_id and old.file_id and new.file_id
    eventually(lambda: chunk_files(cluster, old.file_id or "") == [])
    assert chunk_files(cluster, new.file_id) == [f"{new.file_id}.{i}" for i in range(3)]
    # the same through a rename onto an existing file
    other = client.pipe(f"{ns}/other.bin", b"x" * 10, layout=LAYOUT)
    client.rename(f"{ns}/other.bin", f"{ns}/o.bin", overwrite=True)
    eventually(lambda: chunk_files(cluster, new.file_id or "") == [])
    assert other.file_id is not None and len(chunk_files(cluster, other.file_id)) == 1


def test_recursive_rm_collects_every_file(client: Client, cluster: ThreadCluster, ns: str,
                                          payload) -> None:
    ids = [client.pipe(f"{ns}/t/{d}/f{i}", payload(SMALL + 1 + i), layout=LAYOUT).file_id
           for d in ("a", "b/c") for i in range(3)]
    assert all(len(chunk_files(cluster, f or "")) == 2 for f in ids)
    assert client.rm(f"{ns}/t", recursive=True) == 6
    eventually(lambda: all(chunk_files(cluster, f or "") == [] for f in ids))


# -- a cluster of its own: abandoned uploads and targets that are down ---------------------
@pytest.fixture(scope="module")
def gc_cluster(tmp_path_factory: pytest.TempPathFactory,
               slow_callbacks) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("gc"), 3, upload_grace=0.5)
    yield c
    c.stop()


async def test_abandoned_upload_is_collected(gc_cluster: ThreadCluster, payload) -> None:
    async with AsyncClient(gc_cluster.meta_url, config=load_config(env={})) as c:
        file_id, writer = await c.create("/abandoned.bin", layout=LAYOUT)
        await writer.write(payload(SMALL * 3))
        await writer.close()                         # chunks durable; never committed
        assert len(chunk_files(gc_cluster, file_id)) == 3
        assert not await c.exists("/abandoned.bin")
        deadline = time.monotonic() + 10
        while chunk_files(gc_cluster, file_id):
            assert time.monotonic() < deadline, "the abandoned upload was not collected"
            await asyncio.sleep(0.05)
        with pytest.raises(FileNotFoundError):       # too late to commit now
            await c.commit(file_id, writer)
        assert not await c.exists("/abandoned.bin")


async def test_aborted_upload_is_collected(gc_cluster: ThreadCluster, payload) -> None:
    async with AsyncClient(gc_cluster.meta_url, config=load_config(env={})) as c:
        f = await c.open("/aborted.bin", "wb", layout=LAYOUT)
        await f.write(payload(SMALL * 2))
        assert f.writer is not None
        await f.writer.close()
        assert len(chunk_files(gc_cluster, f.file_id)) == 2
        await f.discard()
        deadline = time.monotonic() + 10
        while chunk_files(gc_cluster, f.file_id):
            assert time.monotonic() < deadline, "the aborted upload was not collected"
            await asyncio.sleep(0.05)
        assert not await c.exists("/aborted.bin")


def test_collection_waits_for_a_target_that_is_down(gc_cluster: ThreadCluster,
                                                    payload) -> None:
    with Client(gc_cluster.meta_url, config=load_config(env={})) as c:
        info = c.pipe("/down.bin", payload(SMALL * 3), layout=LAYOUT)
        assert info.file_id is not None and info.layout is not None
        target = info.layout.targets[0]
        i = next(i for i in range(3) if gc_cluster.target_id(i) == target)
        gc_cluster.stop_data(i)
        try:
            c.rm("/down.bin")
            on_live = [f"{info.file_id}.1", f"{info.file_id}.2"]
            eventually(lambda: not set(on_live) & set(chunk_files(gc_cluster, info.file_id or "")))
            time.sleep(0.5)                          # several GC passes while it is down
            assert chunk_files(gc_cluster, info.file_id) == [f"{info.file_id}.0"]
        finally:
            gc_cluster.start_data(i)
        eventually(lambda: chunk_files(gc_cluster, info.file_id or "") == [])
