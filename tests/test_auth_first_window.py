"""A Loader with auth on asks for its first window's capabilities before it plans the
epoch (stager/loader/pipeline.py ``_warm_first``), so the plan of a large epoch and
the metadata server's answer overlap: the first reads wait for the later of the two,
not for the sum.  They used to be asked for at the first fetch group's flush, once
the whole segment was planned."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import numbered_files_loader, start_cluster

from stager.testing.cluster import ThreadCluster

FILES = 1024                # 32 batches of 32: two look-aheads of 512 files at least


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, slow_callbacks: object
            ) -> Iterator[ThreadCluster]:
    c = start_cluster(Path(tmp_path_factory.mktemp("auth-first")), auth=True)
    yield c
    c.stop()


def test_the_first_capabilities_are_asked_for_before_the_epoch_is_planned(
        cluster: ThreadCluster, ns: str) -> None:
    token = cluster.mint(["read", "write"], (ns,))
    loader = numbered_files_loader(cluster.meta_url, token, ns, FILES, 32)
    try:
        book = loader._client.aio.capabilities
        assert book is not None
        request = book._request
        planned: list[int] = []         # batches planned when each request went out

        async def watched(route: Any, **kwargs: Any) -> object:
            if route.op == "capabilities":
                stream = loader._active
                assert stream is not None
                planned.append(len(stream.pipeline.window.batches))
            return await request(route, **kwargs)
        book._request = watched

        got = sorted(int.from_bytes(s["data"], "big") for b in loader for s in b)
        assert got == list(range(FILES))
        # the first look-ahead (512 files: the window's 6 batches and more) left before
        # the plan was in; asked for at the first flush, the plan held all 32 batches
        assert len(planned) >= 2 and planned[0] == 0, planned
        assert book.fetched == FILES and book.requests == len(planned)
    finally:
        loader.close()
