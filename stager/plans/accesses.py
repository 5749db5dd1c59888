"""Which chunks a set of epoch plans reads, and when: the future that plan-aware
eviction (:mod:`stager.eviction`) looks at.

A Loader's plan is a handful of parameters (the order policy, seed, epochs,
world size, batch size, the dataset's blocks): every rank derives the same
global order from them with :func:`~.order.epoch_order` and takes its batches
with the partition policy, so anyone holding the parameters (the metadata
server, a benchmark) can list every rank's reads without the Loader.  Ranks run
in step: rank ``r``'s batch of global step ``s`` happens at time ``s``; a
global step counts on across the epochs of the plan.

Everything is numpy over the batches' position ranges, so 100,000 samples and
a few epochs take milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..eviction import Uses
from .order import epoch_order
from .partition import PARTITIONS


@dataclass(frozen=True)
class Accesses:
    """The chunk reads of a plan, in time order: at global step ``step[i]``, rank
    ``rank[i]`` reads chunk ``key[i]`` (each chunk once per batch, in the order
    of the batch's first sample in it; within a step, rank 0 first)."""

    key: np.ndarray
    step: np.ndarray
    rank: np.ndarray

    def __len__(self) -> int:
        return len(self.key)

    def uses(self) -> Uses:
        """Next uses by position in this order (what a trace replay asks)."""
        return Uses(self.key)


class SampleChunks:
    """Which chunks each sample reads: sample ``i`` reads chunk keys
    ``keys[starts[i]:starts[i + 1]]`` (integers; none for a sample of no bytes).

    A sample of a tar shard lies in one chunk or across two, a parquet row
    group's or a zarr row's in several: the reads of a batch are the union.
    """

    def __init__(self, starts: np.ndarray, keys: np.ndarray) -> None:
        self.starts = np.asarray(starts, dtype=np.int64)
        self.keys = np.asarray(keys, dtype=np.int64)
        if (self.starts.ndim != 1 or len(self.starts) == 0 or self.starts[0] != 0
                or self.starts[-1] != len(self.keys) or np.any(np.diff(self.starts) < 0)):
            raise ValueError("sample starts must run from 0 to the number of keys, "
                             "never decreasing")

    @classmethod
    def one_each(cls, chunk_of_sample: np.ndarray) -> SampleChunks:
        """Sample ``i`` reads chunk ``chunk_of_sample[i]`` alone."""
        keys = np.asarray(chunk_of_sample, dtype=np.int64)
        return cls(np.arange(len(keys) + 1, dtype=np.int64), keys)

    def __len__(self) -> int:
        return len(self.starts) - 1

    def of(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(how many chunks each of ``samples`` reads, their keys one after another)."""
        first = self.starts[samples]
        counts = self.starts[samples + 1] - first
        total = int(counts.sum())
        offset = np.repeat(first - (np.cumsum(counts) - counts), counts)
        return counts, self.keys[offset + np.arange(total, dtype=np.int64)]


def epoch_steps(total: int, cursor: int, world_size: int, batch_size: int, *,
                partition: str = "interleaved", drop_last: bool = True) -> int:
    """Global steps of an epoch of ``total`` samples from ``cursor``: the most
    batches any rank has (a rank with fewer sits the last step out)."""
    return max(len(PARTITIONS[partition](total, cursor, world_size, rank, batch_size,
                                         drop_last)) for rank in range(world_size))


def plan_accesses(chunk_of_sample: np.ndarray | SampleChunks, *, block_starts: np.ndarray,
                  batch_size: int, world_size: int, epochs: Sequence[int], window: int,
                  seed: int = 0, order: str = "window_of_blocks",
                  partition: str = "interleaved", drop_last: bool = True,
                  cursor: int = 0) -> Accesses:
    """Every rank's chunk reads over ``epochs`` of a plan.

    ``chunk_of_sample[i]`` is the key (an integer) of the chunk holding sample
    ``i``, or a :class:`SampleChunks` where samples read several chunks;
    ``cursor`` is where the first epoch starts (a resumed job), the others
    start at 0.  The other parameters are the Loader's.
    """
    chunks = (chunk_of_sample if isinstance(chunk_of_sample, SampleChunks)
              else SampleChunks.one_each(chunk_of_sample))
    n = len(chunks)
    blocks = np.asarray(block_starts, dtype=np.int64)
    orders: list[np.ndarray] = []
    starts: list[np.ndarray] = []       # per batch: first position (in the joined orders)
    stops: list[np.ndarray] = []
    steps: list[np.ndarray] = []
    ranks: list[np.ndarray] = []
    first_step = 0
    for i, epoch in enumerate(epochs):
        orders.append(epoch_order(order, n, blocks, seed, epoch, window))
        longest = 0
        for rank in range(world_size):
            spans = PARTITIONS[partition](n, cursor if i == 0 else 0, world_size, rank,
                                          batch_size, drop_last)
            base = i * n
            starts.append(np.fromiter((base + s.start for s in spans), np.int64, len(spans)))
            stops.append(np.fromiter((base + s.stop for s in spans), np.int64, len(spans)))
            steps.append(first_step + np.arange(len(spans), dtype=np.int64))
            ranks.append(np.full(len(spans), rank, dtype=np.int64))
            longest = max(longest, len(spans))
        first_step += longest
    if not starts:
        empty = np.zeros(0, dtype=np.int64)
        return Accesses(empty, empty, empty)
    return _reads(chunks, np.concatenate(orders), np.concatenate(starts),
                  np.concatenate(stops), np.concatenate(steps), np.concatenate(ranks))


def _reads(chunks: SampleChunks, sample_at: np.ndarray, start: np.ndarray, stop: np.ndarray,
           step: np.ndarray, rank: np.ndarray) -> Accesses:
    """The chunk reads of batches (``sample_at[p]``: the sample read at position ``p``)."""
    batches = np.lexsort((rank, step))              # time order: by step, then rank
    start, stop, step, rank = start[batches], stop[batches], step[batches], rank[batches]
    length = stop - start
    total = int(length.sum())
    first = np.cumsum(length) - length
    position = np.repeat(start - first, length) + np.arange(total, dtype=np.int64)
    counts, key = chunks.of(sample_at[position])
    batch = np.repeat(np.repeat(np.arange(len(length), dtype=np.int64), length), counts)
    total = len(key)
    # each chunk once per batch, where the batch first reads it
    by_pair = np.lexsort((np.arange(total), key, batch))
    new = np.ones(total, dtype=bool)
    new[1:] = (key[by_pair][1:] != key[by_pair][:-1]) | (batch[by_pair][1:]
                                                         != batch[by_pair][:-1])
    kept = np.sort(by_pair[new])
    return Accesses(key[kept], step[batch[kept]], rank[batch[kept]])
