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

FILES = 6144                # 96 batches of 64: several look-aheads, also of 2,048 files
BATCH = 64
LATE = 0.1                  # seconds each capabilities answer is held back
PACE = 0.01                 # seconds the consumer spends on each batch


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    c = ProcessCluster(Path(tmp_path_factory.mktemp("auth-stalls")), data_servers=3,
                       auth=True)
    c.start()
    yield c
    c.stop()


def test_reads_past_the_first_window_never_wait_for_capabilities(
        cluster: ProcessCluster, ns: str) -> None:
    token = cluster.mint(["read", "write"])
    loader = numbered_files_loader(cluster.meta_url, token, ns, FILES, BATCH)
    try:
        book = loader._client.aio.capabilities
        assert book is not None
        request = book._request
        asked: list[int] = []

        async def late(route: Any, **kwargs: Any) -> object:
            # a busy metadata server: every capabilities answer comes LATE seconds late
            if route.op == "capabilities":
                asked.append(len(kwargs["body"]))
                await asyncio.sleep(LATE)
            return await request(route, **kwargs)
        book._request = late

        got, first = [], None
        for batch in loader:
            if first is None:
                first = book.stalls         # the first window's reads waited: nothing held
            got.extend(int.from_bytes(s["data"], "big") for s in batch)
            time.sleep(PACE)                # a training step: reads run ahead of it
        assert sorted(got) == list(range(FILES))
        assert first is not None and first >= 1
        assert book.stalls == first, (first, book.stalls, len(asked))
        assert book.fetched == FILES and 2 < book.requests == len(asked) < FILES // BATCH
    finally:
        loader.close()
