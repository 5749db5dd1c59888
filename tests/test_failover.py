"""Reads give a silent replica up within failover_timeout and read the next one.

A "black hole" is a real TCP server on 127.0.0.1 that accepts connections and
never answers: what a hung or partitioned data server looks like to a client
(a killed one refuses connections, which fails over at once).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from stager import AsyncClient
from stager.config import load_config
from stager.errors import TargetUnavailable
from stager.layout import chunk_targets
from stager.loader.fetch import Fetcher
from stager.loader.spans import Spans
from stager.protocol.models import FileInfo, LayoutSpec
from stager.testing import ThreadCluster

SMALL = 64 * 1024


@pytest.fixture
def black_hole() -> Iterator[str]:
    """URL of a server that accepts connections and never sends a byte."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
                held.append(conn)
            except TimeoutError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def silenced(info: FileInfo, target: str, url: str) -> FileInfo:
    """``info`` as a client would see it if ``target`` hung."""
    return replace(info, locations={**info.locations, target: url})


async def test_a_silent_primary_fails_over_within_two_seconds(
        cluster: ThreadCluster, ns: str, payload, black_hole: str) -> None:
    data = payload(SMALL * 6 + 5)
    config = load_config(env={})
    async with AsyncClient(cluster.meta_url, config=config) as c:
        info = await c.pipe(f"{ns}/r2.bin", data,
                            layout=LayoutSpec(chunk_size=SMALL, stripe_count=3, replicas=2))
        assert info.layout is not None
        primary = chunk_targets(info.layout, 0)[0]
        hung = silenced(await c.stat(f"{ns}/r2.bin"), primary, black_hole)
        start = time.perf_counter()
        got = await c.reader(hung).read()
        took = time.perf_counter() - start
    print(f"failover: whole-file read with a silent primary took {took:.2f}s "
          f"(failover_timeout {config.failover_timeout}s)")
    assert bytes(got) == data
    assert config.failover_timeout <= took <= 2.0


async def test_batched_reads_fail_over_too(cluster: ThreadCluster, ns: str, payload,
                                           black_hole: str) -> None:
    data = payload(SMALL * 3)
    async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
        info = await c.pipe(f"{ns}/b.bin", data,
                            layout=LayoutSpec(chunk_size=SMALL, stripe_count=3, replicas=2))
        assert info.layout is not None
        primary = chunk_targets(info.layout, 1)[0]
        hung = silenced(await c.stat(f"{ns}/b.bin"), primary, black_hole)
        fetcher = Fetcher(c, [hung])
        start = time.perf_counter()
        out = await fetcher.fetch(Spans.of([(0, SMALL + 100, 500), (0, 10, 20)]))
        took = time.perf_counter() - start
    print(f"failover: batched read with a silent primary took {took:.2f}s")
    assert out == [data[SMALL + 100:SMALL + 600], data[10:30]]
    assert took <= 2.0


async def test_the_last_replica_gets_the_full_request_timeout(
        cluster: ThreadCluster, ns: str, payload, black_hole: str) -> None:
    """No replica left to try: waiting longer is the only chance, so it waits."""
    config = load_config({"request_timeout": 2.5, "retries": 0}, env={})
    async with AsyncClient(cluster.meta_url, config=config) as c:
        info = await c.pipe(f"{ns}/r1.bin", payload(SMALL),
                            layout=LayoutSpec(chunk_size=SMALL, replicas=1))
        assert info.layout is not None
        hung = silenced(await c.stat(f"{ns}/r1.bin"), info.layout.targets[0], black_hole)
        start = time.perf_counter()
        with pytest.raises(TargetUnavailable):
            await c.reader(hung).read()
        took = time.perf_counter() - start
    assert 2.5 <= took < 4.5, took


async def test_a_killed_server_fails_over_at_once(tmp_path, payload) -> None:
    """A dead process refuses connections: no timeout is waited for."""
    with ThreadCluster(tmp_path, 2, replicas=2) as cluster:
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            data = payload(SMALL * 4)
            await c.pipe("/k.bin", data, layout=LayoutSpec(chunk_size=SMALL))
            info = await c.stat("/k.bin")
            cluster.stop_data(0)
            start = time.perf_counter()
            got = await c.reader(info).read()
            took = time.perf_counter() - start
            await asyncio.sleep(0)
    assert bytes(got) == data and took < 0.5, took
