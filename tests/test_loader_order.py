"""Order and partition policies: pure functions, tested without a cluster."""

from __future__ import annotations

import numpy as np
import pytest

from stager.plans.order import (
    ORDERS,
    blocks_per_batch,
    epoch_order,
    regular_blocks,
    shuffle_quality,
)
from stager.plans.partition import PARTITIONS, WORKER_SPLITS, Span, cursor_after

N = 10_007            # a prime: no world size or batch size divides it


def positions(spans: list[Span]) -> list[int]:
    return [p for s in spans for p in range(s.start, s.stop)]


@pytest.mark.parametrize("name", sorted(ORDERS))
def test_every_order_is_a_permutation_and_reproducible(name: str) -> None:
    blocks = regular_blocks(N, 37)
    a = epoch_order(name, N, blocks, 7, 3, 296)
    assert sorted(a.tolist()) == list(range(N))
    assert np.array_equal(a, epoch_order(name, N, blocks, 7, 3, 296))


def test_order_depends_on_seed_and_epoch_only() -> None:
    blocks = regular_blocks(N, 37)
    base = epoch_order("block_window", N, blocks, 1, 0, 296)
    assert not np.array_equal(base, epoch_order("block_window", N, blocks, 2, 0, 296))
    assert not np.array_equal(base, epoch_order("block_window", N, blocks, 1, 1, 296))


def test_order_is_pinned_across_versions() -> None:
    """The hash-based order must never change silently: saved states depend on it.
    (Values recorded when the policy was written.)"""
    assert epoch_order("block_window", 20, regular_blocks(20, 4), 0, 0, 8).tolist() == [
        7, 6, 3, 1, 2, 5, 0, 4, 13, 17, 19, 18, 16, 12, 15, 14, 11, 8, 9, 10]
    assert epoch_order("full", 20, regular_blocks(20, 4), 0, 0, 8).tolist() == [
        17, 15, 8, 14, 5, 9, 2, 3, 7, 0, 18, 19, 11, 12, 16, 6, 1, 10, 13, 4]


def test_windows_of_whole_blocks_are_pinned_and_split_no_block() -> None:
    """``window_of_blocks`` (the default) puts each block in the window its first
    position falls in: pinned on blocks that do not divide the window, every
    block's samples in one window, and the same order as ``block_window`` where
    blocks divide windows evenly."""
    starts = np.array([0, 3, 9, 10, 16, 22, 25, 33])
    order = epoch_order("window_of_blocks", 40, starts, 1, 0, 10)
    assert order.tolist() == [
        23, 15, 8, 12, 14, 13, 3, 22, 10, 5, 11, 4, 24, 6, 7, 21, 17, 18, 19, 16,
        20, 33, 35, 34, 36, 31, 39, 32, 30, 29, 28, 25, 37, 38, 26, 27, 9, 2, 1, 0]
    # cut each order where no block has samples on both sides: every window
    # boundary is such a cut when no window splits a block (4 windows of 10)
    def clean_cuts(order: np.ndarray) -> int:
        block = (np.searchsorted(starts, order, side="right") - 1).tolist()
        last = {b: p for p, b in enumerate(block)}
        cuts, reach = 0, 0
        for p, b in enumerate(block):
            reach = max(reach, last[b])
            cuts += reach == p
        return cuts

    assert clean_cuts(order) >= 4
    assert clean_cuts(epoch_order("block_window", 40, starts, 1, 0, 10)) < 4   # splits
    assert epoch_order("window_of_blocks", 20, regular_blocks(20, 4), 0, 0, 8).tolist() \
        == epoch_order("block_window", 20, regular_blocks(20, 4), 0, 0, 8).tolist()


def test_sequential_keeps_manifest_order() -> None:
    assert epoch_order("sequential", 50, regular_blocks(50, 5), 9, 9, 10).tolist() == \
        list(range(50))


def test_two_level_shuffle_quality_is_measured() -> None:
    """Block+window shuffle: as decorrelated as a full shuffle globally, while a
    batch touches a handful of blocks (a full shuffle touches nearly one per sample)."""
    n, block, batch = 100_000, 250, 256
    blocks = regular_blocks(n, block)
    two = shuffle_quality(epoch_order("block_window", n, blocks, 0, 0, 8 * block), blocks,
                          batch)
    full = shuffle_quality(epoch_order("full", n, blocks, 0, 0, 0), blocks, batch)
    none = shuffle_quality(epoch_order("sequential", n, blocks, 0, 0, 0), blocks, batch)
    assert none["rank_correlation"] == pytest.approx(1.0)
    assert none["displacement"] == 0.0 and none["neighbour_retention"] == 1.0
    assert abs(full["rank_correlation"]) < 0.02
    assert abs(two["rank_correlation"]) < 0.05
    assert 0.9 < full["displacement"] < 1.1 and 0.9 < two["displacement"] < 1.1
    # neighbours are separated nearly as well as by a full shuffle
    assert two["neighbour_retention"] < 0.01
    # ...but each batch reads from at most the ~9 blocks its window overlaps
    assert two["blocks_per_batch"] <= 9.5
    assert full["blocks_per_batch"] > 150
    assert none["blocks_per_batch"] <= 3


def test_blocks_per_batch_counts_distinct_blocks() -> None:
    order = np.array([0, 1, 5, 6, 2, 3, 7, 8])
    assert blocks_per_batch(order, np.array([0, 5]), 4) == 2.0
    assert blocks_per_batch(order, np.array([0, 5]), 2) == 1.0
    assert blocks_per_batch(order, np.array([0, 2, 5, 7]), 4) == 2.0


def test_irregular_blocks_are_moved_whole() -> None:
    starts = np.array([0, 3, 10, 11, 30])
    order = epoch_order("block_window", 40, starts, 5, 0, 1)     # window 1: blocks only
    where = np.argsort(order)                  # position of each sample
    for a, b in zip(starts, [3, 10, 11, 30, 40], strict=True):
        assert np.all(np.diff(where[a:b]) == 1)  # each block stays whole and in order
    assert order.tolist() != list(range(40))


@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("drop_last", [True, False])
def test_ranks_are_disjoint_and_complete(world: int, drop_last: bool) -> None:
    batch = 16
    plans = [PARTITIONS["interleaved"](N, 0, world, r, batch, drop_last) for r in range(world)]
    seen = [positions(p) for p in plans]
    flat = [p for s in seen for p in s]
    assert len(flat) == len(set(flat))
    if drop_last:
        assert len({len(p) for p in plans}) == 1           # DDP: same number of batches
        assert all(len(s) == batch for p in plans for s in p)
        assert set(flat) == set(range(N - N % (world * batch)))
    else:
        assert set(flat) == set(range(N))


@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_workers_split_a_rank_again(world: int, workers: int) -> None:
    batch = 8
    everything = []
    for r in range(world):
        steps = PARTITIONS["interleaved"](N, 0, world, r, batch, False)
        parts = [WORKER_SPLITS["round_robin"](steps, workers, w) for w in range(workers)]
        # round-robin interleaving of the workers gives back the rank's steps in order
        merged = [parts[k % workers][k // workers] for k in range(len(steps))]
        assert merged == steps
        everything += [p for part in parts for p in positions(part)]
    assert sorted(everything) == list(range(N))


@pytest.mark.parametrize(("old", "new"), [(4, 2), (2, 3), (3, 8), (8, 1)])
def test_elastic_resume_covers_the_rest_exactly(old: int, new: int) -> None:
    batch, k = 16, 37
    plans = [PARTITIONS["interleaved"](N, 0, old, r, batch, False) for r in range(old)]
    before = [p for plan in plans for p in positions(plan[:k])]
    cursor = cursor_after(N, 0, old, batch, k, len(plans[0]))
    assert cursor == k * old * batch
    after = [p for r in range(new)
             for p in positions(PARTITIONS["interleaved"](N, cursor, new, r, batch, False))]
    assert sorted(before + after) == list(range(N))


def test_cursor_at_the_end_of_a_plan_is_the_end_of_the_epoch() -> None:
    assert cursor_after(100, 0, 3, 16, 2, 2) == 100


def test_bad_ranks_are_refused() -> None:
    with pytest.raises(ValueError):
        PARTITIONS["interleaved"](10, 0, 2, 2, 4, True)
    with pytest.raises(ValueError):
        PARTITIONS["interleaved"](10, 0, 0, 0, 4, True)
    with pytest.raises(ValueError):
        WORKER_SPLITS["round_robin"]([], 2, 5)


def test_plan_keys_split_units_used_far_apart() -> None:
    """A unit used again within the prefetch horizon keeps its key (fetched once);
    used again further away it gets a new key (fetched again), so memory stays bounded."""
    from stager.loader.window import plan_keys

    units_of = [np.array([0, 0, 1]), np.array([1, 2]), np.array([3]), np.array([3]),
                np.array([0])]
    keys, unit_of, release = plan_keys(units_of, horizon=2, first_key=10)
    flat = [k.tolist() for k in keys]
    assert flat[0][0] == flat[0][1]                   # one key per unit within a batch
    assert flat[0][2] == flat[1][0]                   # unit 1 again one batch later: same key
    assert flat[4][0] != flat[0][0]                   # unit 0 again four batches later: new key
    assert unit_of[flat[4][0]] == unit_of[flat[0][0]] == 0
    assert sorted(unit_of) == list(range(10, 10 + len(unit_of)))
    # every key is released after its last batch, exactly once
    released = [k for ks in release.values() for k in ks]
    assert sorted(released) == sorted(unit_of)
    assert flat[0][2] in release[1] and flat[2][0] in release[3]
