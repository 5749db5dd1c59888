"""A Loader's reads never wait for capabilities past its first window (issue 30): the
look-ahead (stager/loader/pipeline.py ``_warm_ahead``) asks for each batch's well
before the group that reads it starts, even when the metadata server takes its time
to answer.  It used to ask once only two batches were left asked for, so the next
group's reads met the fetch under way, several times an epoch.  The cluster runs as
processes: in this one's threads (and asyncio's debug mode) a capabilities request of
1,024 files took over a second, far from what a Loader meets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import numbered_files_loader

from stager.testing.cluster import ProcessCluster

pytestmark = pytest.mark.slow      # stager processes: not in make check

BATCH = 64
# (files, seconds each capabilities answer is held back, seconds the consumer spends on
# each batch): 96 batches of 64, several look-aheads, also of 2,048 files; and a slower
# metadata server with a faster consumer, over 80 batches, where the look-ahead
# must be several requests deep (stager/loader/pipeline.py WARM_UNDER_WAY): with two
# under way and one look-ahead's lead, the reads from batch 24 on waited for the one
# asked for when the first came back
CASES = [(6144, 0.1, 0.01), (5120, 0.5, 0.005)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    c = ProcessCluster(Path(tmp_path_factory.mktemp("auth-stalls")), data_servers=3,
                       auth=True)
    c.start()
    yield c
    c.stop()


@pytest.mark.parametrize(("files", "late", "pace"), CASES)
def test_reads_past_the_first_window_never_wait_for_capabilities(
        cluster: ProcessCluster, ns: str, files: int, late: float, pace: float) -> None:
    token = cluster.mint(["read", "write"])
    loader = numbered_files_loader(cluster.meta_url, token, ns, files, BATCH)
    try:
        book = loader._client.aio.capabilities
        assert book is not None
        request = book._request
        asked: list[int] = []

        async def slow(route: Any, **kwargs: Any) -> object:
            # a busy metadata server: every capabilities answer comes late
            if route.op == "capabilities":
                asked.append(len(kwargs["body"]))
                await asyncio.sleep(late)
            return await request(route, **kwargs)
        book._request = slow

        got, first = [], None
        for batch in loader:
            if first is None:
                first = book.stalls         # the first window's reads waited: nothing held
            got.extend(int.from_bytes(s["data"], "big") for s in batch)
            time.sleep(pace)                # a training step: reads run ahead of it
        assert sorted(got) == list(range(files))
        assert first is not None and first >= 1
        assert book.stalls == first, (first, book.stalls, len(asked))
        assert book.fetched == files and 2 < book.requests == len(asked) < files // BATCH
    finally:
        loader.close()
