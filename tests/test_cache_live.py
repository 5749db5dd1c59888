"""S3-FIFO on the cluster is S3-FIFO, not LRU replayed (issue 28, item 4).

The evictor keeps a past-looking policy's state between evictions, fed from the chunk
rows (fills, reads, evictions).  The case that tells the two apart: a chunk filled
first and read again, then a scan of chunks read once.  LRU (and a state rebuilt from
the rows by last use, every chunk admitted afresh) evicts the chunk read twice, the
least recently used; S3-FIFO moves it to its main queue for its second read and
evicts the first of the scan, read once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from conftest import start_cluster

from stager import Client
from stager.config import load_config
from stager.testing.countingsource import CountingSource

KiB = 1024
CHUNK = 64 * KiB


@pytest.fixture
def source(tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[CountingSource, dict[str, bytes]]]:
    root = tmp_path_factory.mktemp("src")
    files = {name: os.urandom(CHUNK) for name in ("hot", "s1", "s2", "s3", "s4")}
    for name, data in files.items():
        (root / name).write_bytes(data)
    with CountingSource(root) as server:
        yield server, files


@pytest.mark.parametrize(("policy", "victim"), [("s3fifo", "s1"), ("lru", "hot")])
def test_a_chunk_read_twice_outlives_a_scan_under_s3fifo_not_under_lru(
        tmp_path_factory: pytest.TempPathFactory,
        source: tuple[CountingSource, dict[str, bytes]], policy: str, victim: str) -> None:
    server, files = source
    cluster = start_cluster(tmp_path_factory.mktemp(policy), chunk_size=CHUNK, replicas=1,
                            cache_limit=4 * CHUNK, cache_policy=policy, cache_interval=60)

    def fresh() -> Client:      # knows no CRC32C: each read goes through a fill
        return Client(cluster.meta_url, config=load_config(env={}))
    try:
        with fresh() as client:
            client.attach(server.url + "/", "/d")
            assert client.cat("/d/hot") == files["hot"]
        time.sleep(0.1)
        with fresh() as again:                      # the hot chunk's second read
            assert again.cat("/d/hot") == files["hot"]
        for name in ("s1", "s2", "s3"):             # a scan, each read once
            time.sleep(0.1)
            with fresh() as client:
                assert client.cat(f"/d/{name}") == files[name]
        time.sleep(0.6)         # past the grace of chunks just handed to readers
        with fresh() as client:                     # the cache is full: one must go
            assert client.cat("/d/s4") == files["s4"]
            gets = dict(server.gets)
            for name in ("hot", "s1", "s2", "s3", "s4"):
                assert client.cat(f"/d/{name}") == files[name]
                if name == victim:
                    break           # the victim is fetched again, evicting another
        fetched = {n for n in files if server.gets.get(n, 0) > gets.get(n, 0)}
        assert fetched == {victim}, (policy, fetched)
        # rounds of evictions, fills again of chunks evicted, and reads of them: the
        # kept state follows (a chunk filled again is admitted anew, not read)
        for _ in range(3):
            for name, data in files.items():
                with fresh() as client:
                    assert client.cat(f"/d/{name}") == data
    finally:
        cluster.stop()
