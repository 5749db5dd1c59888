"""An attached directory served by two metadata servers on one PostgreSQL (issue 28,
item 1: one fetch per chunk across nodes).

Sixteen readers, eight on each metadata server, read the same attached file at once
from an HTTP source that counts its ranged GETs: each chunk is fetched once in all,
not once per server (single flight on a server, the store's fill lease across
them), every reader gets the file byte-exact, and reads after that never touch the
source, whichever server they ask.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stager import Client
from stager.config import load_config
from stager.testing import ProcessCluster
from stager.testing.cluster import wait_for_targets
from stager.testing.countingsource import CountingSource

pytestmark = pytest.mark.slow          # stager up and PostgreSQL in subprocesses

KiB = 1024
CHUNK = 64 * KiB
READERS = 16


@pytest.fixture
def two_metas(tmp_path: Path, pg_url: str) -> Iterator[ProcessCluster]:
    with ProcessCluster(tmp_path / "c", data_servers=2, meta_store=pg_url, meta_servers=2,
                        up_args=["--chunk-size", "64KiB"]) as c:
        # the second server learns the targets from the store a moment after the first
        for url in c.meta_urls:
            wait_for_targets(url, up=2)
        yield c


@pytest.fixture
def source(tmp_path: Path) -> Iterator[tuple[CountingSource, bytes]]:
    root = tmp_path / "src"
    root.mkdir()
    data = os.urandom(12 * CHUNK + 321)          # 13 chunks
    (root / "shard.bin").write_bytes(data)
    with CountingSource(root) as server:
        yield server, data


def test_sixteen_readers_on_two_metadata_servers_cost_one_source_request_per_chunk(
        two_metas: ProcessCluster, source: tuple[CountingSource, bytes]) -> None:
    server, data = source
    urls = two_metas.meta_urls
    assert len(urls) == 2
    clients = [Client(urls[i % 2], config=load_config(env={})) for i in range(READERS)]
    try:
        clients[0].attach(server.url + "/", "/web")
        start = threading.Barrier(READERS)

        def read(i: int) -> bytes:
            start.wait()
            return clients[i].cat("/web/shard.bin")

        with ThreadPoolExecutor(READERS) as pool:
            got = list(pool.map(read, range(READERS)))
        assert all(g == data for g in got)
        assert server.gets["shard.bin"] == 13           # one ranged GET per chunk, in all
        # cached now, through either server: the source is not asked again
        for c in clients[:2]:
            assert c.cat("/web/shard.bin", 5, 7 * CHUNK) == data[5:7 * CHUNK]
        assert server.gets["shard.bin"] == 13
        # a miss is a chunk read that found its chunk not yet filled (it waited for the
        # one fetch): many here; every chunk read is counted once, on either server (the
        # rereads, by CRC32Cs the clients learnt, when their reports arrive: 0.2 s)
        deadline = time.monotonic() + 10
        while True:
            [seen] = clients[1].attachments()       # the second server sees the same usage
            if seen.hits + seen.misses >= READERS * 13 + 2 * 7 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert (seen.cached_chunks, seen.cached_bytes) == (13, len(data))
        assert 13 <= seen.misses <= READERS * 13
        assert seen.hits + seen.misses == READERS * 13 + 2 * 7
    finally:
        for c in clients:
            c.close()
