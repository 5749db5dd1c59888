"""A client reads filled chunks by the CRC32Cs it learnt (stager/dataplane/learnt.py).

The metadata server is asked to fill a cached file's chunks only the first time a
client reads them: later reads go straight to the data servers, counted by the
metadata server's request metrics, and are reported in bulk afterwards (route
``cache_reads``) as hits.  A chunk evicted since it was learnt is asked for again and
read byte-exact; a file changed at its source and refreshed is never served mixed.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from conftest import start_cluster

from stager import Client
from stager.config import load_config
from stager.dataplane.learnt import CrcMemory
from stager.errors import NotFound, Unavailable
from stager.protocol.cache import FillItem
from stager.testing import ThreadCluster
from stager.testing.countingsource import CountingSource

KiB = 1024
CHUNK = 64 * KiB
LIMIT = 6 * CHUNK


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("learnt"), chunk_size=CHUNK, replicas=1,
                      cache_limit=LIMIT, cache_interval=0.2)
    yield c
    c.stop()


def new_client(cluster: ThreadCluster) -> Client:
    return Client(cluster.meta_url, config=load_config(env={}))


def requests(cluster: ThreadCluster, op: str) -> int:
    """Requests of route ``op`` the metadata server answered (its /metrics)."""
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            cluster.meta_url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return int(sum(float(v) for v in re.findall(
        rf'^stager_requests_total{{[^}}]*op="{op}"[^}}]*}} (\S+)$', text, re.M)))


def hits(client: Client, path: str) -> tuple[int, int]:
    [a] = [a for a in client.attachments() if a.path == path]
    return a.hits, a.misses


def wait_for(check: object, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():       # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def source(tmp_path: Path) -> Iterator[tuple[Path, dict[str, bytes], CountingSource]]:
    src = tmp_path / "src"
    src.mkdir()
    files = {"a.bin": os.urandom(3 * CHUNK + 5), "b.bin": os.urandom(5 * CHUNK)}
    for name, data in files.items():
        (src / name).write_bytes(data)
    server = CountingSource(src).start()
    yield src, files, server
    server.close()


def test_a_read_of_filled_chunks_asks_the_metadata_server_nothing(
        cluster: ThreadCluster, source: tuple[Path, dict[str, bytes], CountingSource],
        ns: str) -> None:
    _, files, server = source
    path = f"{ns}/web"
    with new_client(cluster) as admin:
        admin.attach(server.url + "/", path)
    reader = new_client(cluster)
    try:
        assert reader.cat(f"{path}/a.bin") == files["a.bin"]
        assert hits(reader, path) == (0, 4)
        fills = requests(cluster, "fill")
        for _ in range(3):      # whole, and in pieces: no fill asked, the source not read
            assert reader.cat(f"{path}/a.bin") == files["a.bin"]
            assert reader.cat(f"{path}/a.bin", CHUNK - 3, 2 * CHUNK + 1) == \
                files["a.bin"][CHUNK - 3:2 * CHUNK + 1]
        assert requests(cluster, "fill") == fills
        assert server.gets["a.bin"] == 4
        # the reads are reported in bulk, off their path: 3 x (4 + 3) hits
        wait_for(lambda: hits(reader, path) == (21, 4), "the reads' report")
        assert requests(cluster, "cache_reads") >= 1
    finally:
        reader.close()
    # another client has learnt nothing: it asks once
    with new_client(cluster) as other:
        assert other.cat(f"{path}/a.bin") == files["a.bin"]
        assert requests(cluster, "fill") == fills + 1
        assert server.gets["a.bin"] == 4


def test_an_evicted_chunk_read_by_a_learnt_crc_is_fetched_again_byte_exact(
        cluster: ThreadCluster, source: tuple[Path, dict[str, bytes], CountingSource],
        ns: str) -> None:
    _, files, server = source
    path = f"{ns}/web"
    with new_client(cluster) as reader:
        reader.attach(server.url + "/", path)
        assert reader.cat(f"{path}/a.bin") == files["a.bin"]      # 4 chunks learnt
        assert reader.cat(f"{path}/b.bin") == files["b.bin"]      # 5 more: a's evicted
        [a] = [a for a in reader.attachments() if a.path == path]
        assert a.cached_bytes <= LIMIT
        fills = requests(cluster, "fill")
        start = time.monotonic()
        assert reader.cat(f"{path}/a.bin") == files["a.bin"]
        took = time.monotonic() - start
        assert requests(cluster, "fill") > fills            # asked again, on the miss
        assert server.gets["a.bin"] > 4                     # evicted chunks fetched again
        assert took < 2.0, f"a read of evicted chunks took {took:.2f} s"


def test_a_file_changed_and_refreshed_is_never_served_mixed_by_learnt_crcs(
        cluster: ThreadCluster, source: tuple[Path, dict[str, bytes], CountingSource],
        ns: str) -> None:
    src, files, server = source
    path = f"{ns}/web"
    old = files["a.bin"]
    with new_client(cluster) as admin, new_client(cluster) as reader:
        admin.attach(server.url + "/", path)
        assert reader.cat(f"{path}/a.bin", 0, 10) == old[:10]    # chunk 0 learnt, old
        new = os.urandom(len(old))
        (src / "a.bin").write_bytes(new)
        os.utime(src / "a.bin", (time.time() + 5, time.time() + 5))
        assert admin.refresh(path).changed == 1
        # the reader's stat is the old file's: chunk 0 by its learnt CRC, the others
        # are asked for, and the old file is gone: the old version whole, or 404 (or,
        # should the reader stat again, the new version whole), never a mix
        try:
            got = reader.cat(f"{path}/a.bin")
        except NotFound:
            got = None
        assert got is None or got == old or got == new
        wait_for(lambda: _reads(reader, f"{path}/a.bin") == new, "the new version")
        assert reader.cat(f"{path}/a.bin", 0, 10) == new[:10]


def _reads(client: Client, path: str) -> bytes | None:
    client.stat(path, cached=False)
    try:
        return client.cat(path)
    except NotFound:
        return None


def test_the_memory_is_bounded_and_forgets_what_a_target_lacked() -> None:
    memory = CrcMemory(limit=4)
    f, g, h = "f" * 32, "a" * 32, "b" * 32
    memory.learn([f"{f}.0", f"{f}.1", f"{g}.0"], [1, 2, 3])
    assert (memory.crc(f"{f}.1"), memory.crc(f"{g}.0"), memory.crc(f"{g}.1")) == (2, 3, None)
    memory.learn([f"{h}.0", f"{h}.1"], [4, 5])          # past the limit: the first file goes
    assert len(memory) == 3 and memory.crc(f"{f}.0") is None and memory.crc(f"{h}.1") == 5
    memory.forget([f"{h}.1", f"{h}.9"])
    assert len(memory) == 2 and memory.crc(f"{h}.1") is None


def test_reads_are_reported_in_bulk_and_a_refused_report_costs_nothing() -> None:
    sent: list[list[FillItem]] = []

    async def report(items: Sequence[FillItem]) -> None:
        sent.append(list(items))
        if len(sent) == 1:
            raise Unavailable("the metadata server is away")

    async def run() -> None:
        memory = CrcMemory(report, every=0.01)
        memory.read(["f" * 32 + ".0", "f" * 32 + ".1"])
        memory.read(["a" * 32 + ".3"])
        await asyncio.sleep(0.1)                 # one report, refused: logged, not raised
        memory.read(["a" * 32 + ".4"])
        await memory.close()                     # the last ones reported at close

    asyncio.run(run())
    assert sent[0] == [FillItem("f" * 32, (0, 1)), FillItem("a" * 32, (3,))]
    assert sent[1:] == [[FillItem("a" * 32, (4,))]]
