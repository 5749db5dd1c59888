"""A fresh Loader hands over its first batch only once the prefetch window is full
(every batch admitted before the first that must wait for the consumer is built),
so a consumer paced just under the loader's rate does not catch up with a window
still filling during the first epoch; ``prefetch_fill=False`` hands it over at once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from loader_data import write_tar

from stager import Client, Loader
from stager.testing import ThreadCluster


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    c = ThreadCluster(tmp_path_factory.mktemp("fill-cluster"), 2)
    c.start()
    with Client(c.meta_url) as client:
        write_tar(client, "/fill", shards=4, per_shard=64)
    yield c.meta_url
    c.stop()


def _built(loader: Loader) -> list[int]:
    """The batches of the running pipeline that are built and not yet taken."""
    assert loader._active is not None
    pipeline = loader._active.pipeline
    with pipeline._lock:
        return sorted(j for j, slot in pipeline._slots.items() if slot.done())


def test_the_first_batch_comes_with_the_window_full(meta: str) -> None:
    with Loader("/fill", meta_url=meta, batch_size=8, seed=1, prefetch_batches=6) as loader:
        it = iter(loader)
        first = next(it)
        assert loader._active is not None
        filled = loader._active.pipeline.filled
        assert filled is not None and filled.done()
        n = filled.result()
        # a new fetch group waits for room for half the window: at least 4 of 6 admitted
        assert 4 <= n <= 6
        assert _built(loader) == list(range(1, n))     # all built, before the consumer asks
        assert len(first) == 8
        rest = list(it)
        assert len(rest) + 1 == len(loader)            # the whole epoch, once
        # a later epoch's pipeline is the running one: it does not wait again
        assert sum(1 for _ in loader) == len(rest) + 1


def test_the_whole_epoch_within_the_window(meta: str) -> None:
    """An epoch shorter than the window: its first batch waits for all of it."""
    with Loader("/fill", meta_url=meta, batch_size=64, seed=1, prefetch_batches=16,
                prefetch_next_epoch=False) as loader:
        it = iter(loader)
        next(it)
        assert loader._active is not None
        assert loader._active.pipeline.filled.result() == 4
        assert _built(loader) == [1, 2, 3]
        assert len(list(it)) == 3


def test_fill_can_be_turned_off(meta: str) -> None:
    with Loader("/fill", meta_url=meta, batch_size=8, seed=1, prefetch_batches=6,
                prefetch_fill=False) as loader:
        it = iter(loader)
        next(it)
        assert loader._active is not None and loader._active.pipeline.filled is None
        assert len(list(it)) + 1 == len(loader)
