"""Epoch orders: pure functions of (seed, epoch, the dataset's blocks), registered by name.

An order policy returns a permutation of ``range(n)``: position ``p`` of the
epoch reads sample ``order[p]``.  It never sees the world size, the rank or the
batch size, so every rank of every job size computes the same global order and
resume with another world size is exact.

Randomness comes from a counter-based hash (splitmix64) of ``(seed, epoch,
salt, i)`` rather than from a stateful generator, so the order is the same on
every machine, in every process and with every numpy version.

``shuffle_quality`` measures how close an order is to a full shuffle (and how
few blocks each batch touches), so the two-level shuffle's trade-off is a
number, not a claim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..policies import Registry

#: (n, block_starts, seed, epoch, window) -> permutation of range(n)
OrderPolicy = Callable[[int, np.ndarray, int, int, int], np.ndarray]
ORDERS: Registry[OrderPolicy] = Registry("order")

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MASK = (1 << 64) - 1


order_policy = ORDERS.register
#: the default shuffles, past and present (a saved state may name either)
TWO_LEVEL = ("block_window", "window_of_blocks")


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on uint64 (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def hash_keys(seed: int, epoch: int, salt: int, count: int) -> np.ndarray:
    """``count`` pseudo-random uint64 keys determined by (seed, epoch, salt)."""
    base = _mix(np.array([seed & _MASK], dtype=np.uint64))
    base = _mix(base ^ np.array([epoch & _MASK], dtype=np.uint64))
    base = _mix(base ^ np.array([salt & _MASK], dtype=np.uint64))
    return _mix(np.arange(count, dtype=np.uint64) * _GOLDEN + base)


def permutation(count: int, seed: int, epoch: int, salt: int) -> np.ndarray:
    return np.argsort(hash_keys(seed, epoch, salt, count), kind="stable").astype(np.int64)


def block_lengths(n: int, block_starts: np.ndarray) -> np.ndarray:
    return np.diff(np.append(block_starts, n)).astype(np.int64)


def regular_blocks(n: int, size: int) -> np.ndarray:
    """Block starts of blocks of ``size`` consecutive samples."""
    return np.arange(0, n, max(1, size), dtype=np.int64)


def check_blocks(n: int, block_starts: np.ndarray) -> np.ndarray:
    starts = np.asarray(block_starts, dtype=np.int64)
    if n and (len(starts) == 0 or starts[0] != 0 or np.any(np.diff(starts) <= 0)
              or starts[-1] >= n):
        raise ValueError("block starts must begin at 0 and increase strictly below n")
    return starts


@order_policy("sequential")
def sequential(n: int, block_starts: np.ndarray, seed: int, epoch: int,
               window: int) -> np.ndarray:
    """The manifest order (``shuffle=False``)."""
    return np.arange(n, dtype=np.int64)


@order_policy("full")
def full_shuffle(n: int, block_starts: np.ndarray, seed: int, epoch: int,
                 window: int) -> np.ndarray:
    """A uniform permutation of every sample: the quality reference, poor locality."""
    return permutation(n, seed, epoch, salt=1)


@order_policy("block_window")
def block_window(n: int, block_starts: np.ndarray, seed: int, epoch: int,
                 window: int) -> np.ndarray:
    """Two-level shuffle: permute blocks of neighbouring samples, then shuffle
    inside each window of ``window`` consecutive positions.

    A batch's samples then come from the few blocks that overlap its window,
    so its reads concentrate on few chunks, while across the epoch every
    block lands anywhere.
    """
    return _two_level(n, block_starts, seed, epoch, window, whole_blocks=False)


@order_policy("window_of_blocks")
def window_of_blocks(n: int, block_starts: np.ndarray, seed: int, epoch: int,
                     window: int) -> np.ndarray:
    """The two-level shuffle with windows of whole blocks (the default): a block
    belongs to the window its first position falls in, so a window is ``window``
    positions give or take a block, and no block is split between two windows.

    The loader fetches a window's batches together: a block split between two
    windows meant its chunk was read in fragments, half by each.  Where blocks
    divide the window evenly this is the same order as ``block_window``.
    """
    return _two_level(n, block_starts, seed, epoch, window, whole_blocks=True)


def _two_level(n: int, block_starts: np.ndarray, seed: int, epoch: int, window: int, *,
               whole_blocks: bool) -> np.ndarray:
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = check_blocks(n, block_starts)
    lengths = block_lengths(n, starts)
    perm = permutation(len(starts), seed, epoch, salt=2)
    new_lengths = lengths[perm]
    new_starts = np.concatenate(([0], np.cumsum(new_lengths)[:-1]))
    # position p inside moved block k reads starts[perm[k]] + (p - new_starts[k])
    seq = np.repeat(starts[perm] - new_starts, new_lengths) + np.arange(n, dtype=np.int64)
    window = max(1, int(window))
    if window == 1:
        return seq
    keys = hash_keys(seed, epoch, 3, n)
    if whole_blocks:
        windows = np.repeat(new_starts // window, new_lengths)
    else:
        windows = np.arange(n, dtype=np.int64) // window
    return seq[np.lexsort((keys, windows))]


def epoch_order(name: str, n: int, block_starts: np.ndarray, seed: int, epoch: int,
                window: int) -> np.ndarray:
    policy = ORDERS[name]
    out = policy(n, block_starts, seed, epoch, window)
    if len(out) != n:
        raise AssertionError(f"order {name} returned {len(out)} positions for {n} samples")
    return out


# -- quality ---------------------------------------------------------------------------
def rank_correlation(order: np.ndarray) -> float:
    """Spearman's rank correlation between position and sample index: 1 for no
    shuffle, about 0 for a full shuffle (positions and indices are both ranks)."""
    n = len(order)
    if n < 2:
        return 1.0
    pos = np.arange(n, dtype=np.float64)
    return float(np.corrcoef(pos, order.astype(np.float64))[0, 1])


def displacement(order: np.ndarray) -> float:
    """Mean |position − index| over what a full shuffle gives on average
    ((n² − 1) / 3n): 0 for no shuffle, about 1 for a full shuffle."""
    n = len(order)
    if n < 2:
        return 0.0
    mean = float(np.mean(np.abs(order - np.arange(n))))
    return mean / ((n * n - 1) / (3 * n))


def neighbour_retention(order: np.ndarray) -> float:
    """Fraction of consecutive positions holding consecutive samples (1 unshuffled)."""
    if len(order) < 2:
        return 1.0
    return float(np.mean(np.abs(np.diff(order)) == 1))


def blocks_per_batch(order: np.ndarray, block_starts: np.ndarray, batch_size: int) -> float:
    """Mean number of distinct blocks a batch of consecutive positions reads."""
    n = len(order)
    if n == 0:
        return 0.0
    block_of = np.searchsorted(block_starts, order, side="right") - 1
    full = n - n % batch_size or n
    rows = block_of[:full].reshape(-1, min(batch_size, full))
    rows = np.sort(rows, axis=1)
    distinct = 1 + np.sum(np.diff(rows, axis=1) != 0, axis=1)
    return float(np.mean(distinct))


def shuffle_quality(order: np.ndarray, block_starts: np.ndarray,
                    batch_size: int) -> dict[str, Any]:
    """Every measure above for one order."""
    return {
        "rank_correlation": rank_correlation(order),
        "displacement": displacement(order),
        "neighbour_retention": neighbour_retention(order),
        "blocks_per_batch": blocks_per_batch(order, block_starts, batch_size),
    }
