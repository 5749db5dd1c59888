"""Restarts keep everything committed: the metadata server, data servers, `stager up`."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from aiohttp import web
from conftest import start_cluster
from fsspec.asyn import sync

from stager import AsyncClient, Client
from stager.config import load_config
from stager.errors import Unavailable
from stager.protocol.models import LayoutSpec
from stager.testing import ProcessCluster, ThreadCluster, wait_for_targets
from stager.web.server import start_sites, stop_sites

pytestmark = pytest.mark.slow      # stager processes: not in make check

SMALL = 64 * 1024


@pytest.fixture
def own_cluster(tmp_path: Path, slow_callbacks) -> Iterator[ThreadCluster]:
    """A cluster this test may stop and start at will."""
    c = start_cluster(tmp_path / "cluster", 3)
    yield c
    c.stop()


def fresh_client(cluster: ThreadCluster) -> Client:
    return Client(cluster.meta_url, config=load_config(env={}))


def snapshot(c: Client, root: str) -> dict[str, object]:
    """Everything ``stat`` says about every path below ``root``, and every file's bytes."""
    out: dict[str, object] = {}
    stack = [root]
    while stack:
        path = stack.pop()
        info = c.stat(path, cached=False)
        body = info.to_json()
        body.pop("locations", None)          # data servers may come back on new ports
        out[path] = body
        if info.is_dir:
            stack.extend(e.path for e in c.ls(path))
        else:
            out[path + "#bytes"] = c.cat(path)
    return out


def populate(c: Client, payload) -> None:  # type: ignore[no-untyped-def]
    c.mkdir("/data/train", layout=LayoutSpec(chunk_size=SMALL, stripe_count=2))
    c.pipe("/data/train/a.bin", payload(SMALL * 3 + 1))
    c.pipe("/data/train/b.bin", payload(0))
    c.pipe("/data/r2.bin", payload(SMALL * 2), layout=LayoutSpec(chunk_size=SMALL, replicas=2))
    c.pipe("/top.bin", payload(5 * 1024 * 1024))
    c.mkdir("/empty/dir")


def test_metadata_restart_keeps_the_namespace(own_cluster: ThreadCluster, payload) -> None:
    cluster = own_cluster
    with fresh_client(cluster) as c:
        populate(c, payload)
        before = snapshot(c, "/")
        file_id, writer = sync(c.loop, c.aio.create, "/data/pending.bin")   # never committed
        sync(c.loop, writer.write, b"p" * 1000)
    url = cluster.meta_url
    port = urlsplit(url).port
    assert port is not None
    cluster.stop_meta()
    with Client(url, config=load_config(env={})) as c:   # nobody is listening now
        with pytest.raises(Unavailable):
            c.stat("/top.bin", cached=False)
    cluster.start_meta(port)
    started = time.time()
    assert cluster.meta_url == url
    cluster.wait_targets(3)
    with fresh_client(cluster) as c:
        # a restarted server trusts its stored targets only until they heartbeat
        deadline = time.monotonic() + 10
        while not all(t.last_heartbeat > started + 0.3 for t in c.targets()):
            assert time.monotonic() < deadline, "data servers did not heartbeat the new server"
            time.sleep(0.05)
        assert snapshot(c, "/") == before
        assert not c.exists("/data/pending.bin")
        assert c.stat("/data/train", cached=False).default_layout == \
            LayoutSpec(chunk_size=SMALL, stripe_count=2)
        # data servers heartbeat the new metadata server; writes still work
        c.pipe("/after.bin", b"after restart")
        assert c.cat("/after.bin") == b"after restart"
        assert c.status()["targets_up"] == 3


def test_data_servers_register_with_a_metadata_server_that_forgot_them(
        own_cluster: ThreadCluster) -> None:
    cluster = own_cluster
    port = urlsplit(cluster.meta_url).port
    assert port is not None
    cluster.stop_meta()
    shutil.rmtree(cluster.root / "meta")               # a new, empty metadata server
    cluster.start_meta(port)
    with fresh_client(cluster) as c:
        cluster.wait_targets(3)                        # heartbeats got 404: registered again
        assert sorted(t.id for t in c.targets()) == sorted(cluster.target_id(i)
                                                           for i in range(3))
        c.pipe("/fresh.bin", b"fresh")
        assert c.cat("/fresh.bin") == b"fresh"


async def test_one_client_across_a_metadata_restart(own_cluster: ThreadCluster) -> None:
    """A write begun before the restart commits after it, on the same client."""
    cluster = own_cluster
    port = urlsplit(cluster.meta_url).port
    assert port is not None
    async with AsyncClient(cluster.meta_url, config=load_config(env={})) as ac:
        file_id, writer = await ac.create("/u.bin", layout=LayoutSpec(chunk_size=SMALL))
        await writer.write(b"u" * (SMALL + 3))
        await writer.close()                 # every chunk durable, nothing committed
        await asyncio.to_thread(cluster.stop_meta)
        await asyncio.to_thread(cluster.start_meta, port)
        await asyncio.to_thread(cluster.wait_targets, 3)
        assert not await ac.exists("/u.bin")
        info = await ac.commit(file_id, writer)
        assert info.size == SMALL + 3
        assert await ac.cat("/u.bin") == b"u" * (SMALL + 3)


def test_data_server_restart_keeps_chunks_and_identity(own_cluster: ThreadCluster,
                                                       payload) -> None:
    cluster = own_cluster
    data = payload(SMALL * 6)
    with fresh_client(cluster) as c:
        c.pipe("/d.bin", data, layout=LayoutSpec(chunk_size=SMALL))
    target = cluster.target_id(1)
    old_url = cluster.data[1].url  # type: ignore[union-attr]
    cluster.stop_data(1)
    # a crash mid-write leaves a temporary file; the next start removes it
    leftover = cluster.root / "data1" / "chunks" / "ab" / "cd" / ".abcd.0.1234.tmp"
    leftover.parent.mkdir(parents=True, exist_ok=True)
    leftover.write_bytes(b"half a chunk")
    cluster.start_data(1)
    assert not leftover.exists()
    assert cluster.target_id(1) == target
    new_url = cluster.data[1].url  # type: ignore[union-attr]
    deadline = time.monotonic() + 10
    with fresh_client(cluster) as c:
        while True:
            urls = {t.id: t.url for t in c.targets()}
            if urls[target] == new_url:
                break
            assert time.monotonic() < deadline, "the restarted data server did not register"
            time.sleep(0.05)
        assert new_url != old_url or urls[target] == old_url
        assert c.cat("/d.bin") == data
        assert len(c.targets()) == 3                       # the same target, not a new one


# -- `stager up` as a process --------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_stager_up_stops_cleanly_and_comes_back(tmp_path: Path, payload) -> None:
    root = tmp_path / "up"
    files = {"/a/one.bin": payload(SMALL * 3 + 7), "/a/two.bin": payload(5 * 1024 * 1024 + 1),
             "/empty.bin": b""}
    cluster = ProcessCluster(root, data_servers=3, replicas=1)
    cluster.start()
    try:
        info = json.loads((root / "cluster.json").read_text())
        assert {"meta", "data", "pid"} <= set(info)
        assert len(info["data"]) == 3
        for i, d in enumerate(info["data"]):
            assert set(d) >= {"url", "pid", "root", "node"} and d["node"] == f"node{i}"
            assert d["url"].startswith("http://127.0.0.1:")
        assert set(info["meta"]) >= {"url", "pid", "root"}
        pids = [info["meta"]["pid"], *(d["pid"] for d in info["data"])]
        assert all(_alive(p) for p in pids)
        with Client(cluster.meta_url, config=load_config(env={})) as c:
            for path, data in files.items():
                c.pipe(path, data, layout=LayoutSpec(chunk_size=SMALL, replicas=1))
            targets_before = sorted(t.id for t in c.targets())
            nodes = {t.node for t in c.targets()}
            assert nodes == {"node0", "node1", "node2"}
    finally:
        code = cluster.stop()                          # SIGTERM
    assert code == 0
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)], "a server outlived `stager up`"
    assert not (root / "cluster.json").exists()

    cluster = ProcessCluster(root, data_servers=3, replicas=1)
    cluster.start()
    try:
        wait_for_targets(cluster.meta_url, 3, exact=True)
        with Client(cluster.meta_url, config=load_config(env={})) as c:
            assert sorted(t.id for t in c.targets()) == targets_before
            for path, data in files.items():
                assert c.cat(path) == data
            assert [e.name for e in c.ls("/a")] == ["one.bin", "two.bin"]
    finally:
        assert cluster.stop() == 0


def test_stager_up_children_die_with_it(tmp_path: Path) -> None:
    """Even a SIGKILLed `stager up` takes its servers with it (no orphans on a port)."""
    cluster = ProcessCluster(tmp_path / "up", data_servers=2)
    cluster.start()
    info = cluster.info
    pids = [info["meta"]["pid"], *(d["pid"] for d in info["data"])]
    assert cluster.proc is not None
    os.kill(cluster.proc.pid, signal.SIGKILL)
    cluster.proc.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)]
    cluster.proc = None


async def test_a_connection_accepted_as_a_server_stops_is_closed_with_it() -> None:
    """asyncio accepts a connection in one turn of the loop and makes its transport
    in the next; a server closed in between left that connection half-made and open
    (a ResourceWarning, an error here, when the collector found it)."""
    runner = web.AppRunner(web.Application())
    await runner.setup()
    sockets = await start_sites(runner, "127.0.0.1", 0)
    port = sockets[0].getsockname()[1]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        await asyncio.sleep(0)        # the loop accepts it after this task's turn ...
        await asyncio.sleep(0)        # ... and would make its transport after this one
        await stop_sites(runner, sockets)
        assert await asyncio.to_thread(client.recv, 1) == b""   # closed, not left open
    gc.collect()
    assert all(s.fileno() == -1 for s in sockets)
