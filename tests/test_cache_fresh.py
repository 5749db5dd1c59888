"""A fresh client reads chunks cached already as it reads a staged file's (issue 28).

A client that has never read a cached file knows none of its chunks' CRC32Cs, and its
read engine asks the metadata server to fill (at least: to name the CRC32Cs of) every
chunk before reading it: a round trip per read plan that a staged file's read does not
pay.  A Loader over cached files registers its plan first thing; the registration's
answer names the CRC32Cs of the dataset's chunks filled already, which the client
learns, so a fresh Loader's epoch over a cached dataset asks no fill (the metadata
server's request metrics count them) and never the source; the other ranks' clients
ask for the same with their first position report.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from conftest import start_cluster
from fsspec.asyn import sync
from test_cache_learnt import hits, new_client, requests, wait_for

from stager import Loader
from stager.protocol.cache import PlanPosition, PlanRequest
from stager.testing import ThreadCluster
from stager.testing.countingsource import CountingSource

KiB = 1024
CHUNK = 64 * KiB
FILES = 40


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("fresh"), chunk_size=CHUNK, replicas=1)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[CountingSource, dict[str, bytes]]]:
    root = tmp_path_factory.mktemp("src")
    files = {f"s{i:03d}.bin": os.urandom(CHUNK + i * 1000) for i in range(FILES)}
    for name, data in files.items():
        (root / name).write_bytes(data)
    server = CountingSource(root).start()
    yield server, files
    server.close()


def filled_by_another(cluster: ThreadCluster, server: CountingSource,
                      files: dict[str, bytes], path: str) -> int:
    """``path`` attached and every file read once by another client: the source GETs."""
    with new_client(cluster) as other:
        other.attach(server.url + "/", path)
        for name, data in files.items():
            assert other.cat(f"{path}/{name}") == data
    return sum(server.gets.values())


def test_a_registration_answers_the_filled_crcs_and_reads_then_ask_nothing(
        cluster: ThreadCluster, source: tuple[CountingSource, dict[str, bytes]],
        ns: str) -> None:
    server, files = source
    path = f"{ns}/lake"
    gets = filled_by_another(cluster, server, files, path)
    with new_client(cluster) as fresh:
        infos = [fresh.stat(f"{path}/{name}") for name in files]
        ids = [i.file_id or "" for i in infos]
        dataset = {"files": ids, "chunk_sizes": [CHUNK] * FILES, "samples": FILES,
                   "sample": list(range(FILES)), "file": list(range(FILES)),
                   "offset": [0] * FILES, "length": [i.size for i in infos]}
        plan = {"seed": 0, "epoch": 0, "world_size": 1, "batch_size": 2, "window": 4}
        done = sync(fresh.loop, fresh.aio.register_plan, "ab12cd34",
                    PlanRequest(plan, dataset, PlanPosition(0, 0)))
        # every chunk is filled and named with its CRC32C: two a file, but s000's one
        assert sorted(done.filled) == sorted(ids)
        assert sum(len(c) for c in done.filled.values()) == 2 * FILES - 1
        fills = requests(cluster, "fill")
        before = hits(fresh, path)
        for name, data in files.items():
            assert fresh.cat(f"{path}/{name}") == data
        assert requests(cluster, "fill") == fills       # no fill asked
        assert sum(server.gets.values()) == gets        # the source not read
        # the reads still count as hits (reported in bulk, after the fact)
        wait_for(lambda: hits(fresh, path)[0] == before[0] + 2 * FILES - 1,
                 "the reads' report")


def test_another_ranks_first_position_report_learns_the_filled_crcs(
        cluster: ThreadCluster, source: tuple[CountingSource, dict[str, bytes]],
        ns: str) -> None:
    server, files = source
    path = f"{ns}/lake"
    gets = filled_by_another(cluster, server, files, path)
    with new_client(cluster) as rank0, new_client(cluster) as rank1:
        infos = [rank0.stat(f"{path}/{name}") for name in files]
        dataset = {"files": [i.file_id or "" for i in infos], "chunk_sizes": [CHUNK] * FILES,
                   "samples": FILES, "sample": list(range(FILES)), "file": list(range(FILES)),
                   "offset": [0] * FILES, "length": [i.size for i in infos]}
        plan = {"seed": 0, "epoch": 0, "world_size": 2, "batch_size": 2, "window": 4}
        sync(rank0.loop, rank0.aio.register_plan, "ef56ab78",
             PlanRequest(plan, dataset, PlanPosition(0, 0)))
        sync(rank1.loop, rank1.aio.plan_position, "ef56ab78", 0, 0, 1)
        fills = requests(cluster, "fill")
        for name, data in files.items():
            assert rank1.cat(f"{path}/{name}") == data
        assert requests(cluster, "fill") == fills
        assert sum(server.gets.values()) == gets


def test_a_fresh_loaders_epoch_over_a_cached_dataset_asks_almost_no_fill(
        cluster: ThreadCluster, source: tuple[CountingSource, dict[str, bytes]],
        ns: str) -> None:
    server, files = source
    path = f"{ns}/lake"
    gets = filled_by_another(cluster, server, files, path)
    fills = requests(cluster, "fill")
    with Loader(path, meta_url=cluster.meta_url, batch_size=2, format="files", seed=1,
                prefetch_next_epoch=False) as loader:
        seen = {s["__key__"]: s["data"] for batch in loader for s in batch}
    assert seen == files
    assert sum(server.gets.values()) == gets
    # the registration goes out as the pass starts, beside the first batches' reads: those
    # may still ask (3 or 4 here; before the registration answered, each of the 20
    # batches asked one)
    assert requests(cluster, "fill") - fills <= FILES // 2 // 2
