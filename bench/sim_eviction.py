"""Eviction policies on issue 28's scenario, simulated: ``python -m bench.sim_eviction``.

A simulation of the policies (:mod:`stager.eviction`), not a measurement of the
servers; ``python -m bench cache`` reports it (:mod:`bench.bench_cache`), and
this module's command prints it for other sizes.  The scenario: tar shards
1.5x the cache, read for two shuffled epochs by a Loader with world size 2 and
the default order (``window_of_blocks``, a shuffle block per chunk of a shard
as the tar format gives, the Loader's default window of 8 blocks).  Samples
vary in size and many cross a chunk boundary, so a batch reads the chunks of
its samples' extents.

The trace is every rank's chunk reads in step order (each chunk once per
batch), derived as the metadata server derives them: from the plan's
parameters as a Loader registers them and the dataset's sample extents
(:mod:`stager.plans.registered`).  ``plan`` evicts by that registered plan's
next uses (:class:`~stager.plans.registered.PlanUses`), ``belady`` by the
trace's own (the offline optimum), ``lru`` and ``s3fifo`` by the past.

Printed per policy: the hit ratio of chunk reads and the source requests, over
both epochs and over the second alone (the first fetches every chunk once
whatever the policy).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from stager.eviction import Simulated, Uses, simulate
from stager.plans.accesses import Accesses
from stager.plans.registered import Dataset, Plan, plan_uses, registered_accesses

MiB = 1 << 20
POLICIES = ("lru", "s3fifo", "plan", "belady")


@dataclass(frozen=True, eq=False)
class Scenario:
    """A dataset, the plan a Loader registers for it, and the cache it is read through."""

    dataset: Dataset
    plan: dict[str, Any]            # as a request body has it
    sizes: dict[int, int]           # chunk key -> bytes
    capacity: int                   # bytes

    @property
    def nbytes(self) -> int:
        return sum(self.sizes.values())


def tar_shards(chunks: int, per_chunk: int, *, shard_chunks: int = 64,
               chunk_size: int = 4 * MiB, seed: int = 0) -> tuple[Dataset, np.ndarray,
                                                                  dict[int, int]]:
    """``chunks`` chunks of tar-like shards of ``shard_chunks`` chunks each, about
    ``per_chunk`` samples a chunk (sizes 0.5-1.5x the mean, end to end).
    Returns (the dataset, its shuffle blocks, bytes of each chunk key)."""
    rng = np.random.default_rng(seed)
    mean = chunk_size // per_chunk
    files: list[str] = []
    sample_file: list[np.ndarray] = []
    offsets: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    sizes: dict[int, int] = {}
    for shard, first in enumerate(range(0, chunks, shard_chunks)):
        size = min(shard_chunks, chunks - first) * chunk_size
        length = rng.integers(mean // 2, mean * 3 // 2, 2 * size // mean + 2)
        length = length[:np.searchsorted(np.cumsum(length), size, side="right")]
        files.append(f"shard-{shard:05d}")
        sample_file.append(np.full(len(length), shard))
        offsets.append(np.cumsum(length) - length)
        lengths.append(length)
        for c in range(-(-size // chunk_size)):
            sizes[shard << 32 | c] = min(chunk_size, size - c * chunk_size)
    file, offset = np.concatenate(sample_file), np.concatenate(offsets)
    n = len(file)
    data = Dataset(tuple(files), (chunk_size,) * len(files), n, sample=np.arange(n),
                   file=file, offset=offset, length=np.concatenate(lengths))
    # a block is the samples starting in one chunk of one shard (the tar format's)
    first = offset // chunk_size
    change = (np.diff(file) != 0) | (np.diff(first) != 0)
    blocks = np.concatenate(([0], np.nonzero(change)[0] + 1)).astype(np.int64)
    return data, blocks, sizes


def scenario(chunks: int, per_chunk: int = 32, *, world: int = 2, batch: int = 32,
             seed: int = 0, ratio: float = 1.5) -> Scenario:
    """Issue 28's scenario: two shuffled epochs of a dataset ``ratio`` x the cache."""
    data, blocks, sizes = tar_shards(chunks, per_chunk, seed=seed)
    window = max(1, round(8 * data.samples / len(blocks)))    # the Loader's default
    plan = {"seed": seed, "epoch": 0, "epochs": 2, "world_size": world, "batch_size": batch,
            "window": window, "blocks": blocks.tolist()}
    return Scenario(data, plan, sizes, int(sum(sizes.values()) / ratio))


@dataclass(frozen=True)
class Compared:
    """What each policy did over both epochs (``whole``) and the first alone."""

    reads: int
    second: int                     # where the second epoch starts in the trace
    whole: dict[str, Simulated]
    first: dict[str, Simulated]
    seconds: dict[str, float]       # simulation time of ``whole``

    def second_epoch(self, policy: str) -> tuple[float, int]:
        """(hit ratio, source requests) of the second epoch alone."""
        whole, first = self.whole[policy], self.first[policy]
        hits, misses = whole.hits - first.hits, whole.misses - first.misses
        return hits / max(1, hits + misses), misses


def trace_of(s: Scenario) -> tuple[Accesses, int]:
    """The plan's chunk reads and where its second epoch starts among them."""
    plan = Plan.from_dict(s.plan, s.dataset.samples)
    accesses = registered_accesses(plan, s.dataset)
    return accesses, int(np.searchsorted(accesses.step, plan.steps(s.dataset.samples, True)))


def compare(s: Scenario, policies: tuple[str, ...] = POLICIES) -> Compared:
    """Each policy over the scenario's trace, through a cache of ``s.capacity``."""
    accesses, second = trace_of(s)
    trace = accesses.key
    # plan: the next uses the metadata server derives from the registered parameters
    registered = plan_uses(s.plan, s.dataset)
    step, rank, name = accesses.step.tolist(), accesses.rank.tolist(), s.dataset.name

    def by_plan(key: int, now: int) -> float:
        return registered.after(name(key), step[now], rank[now])

    uses = {"plan": by_plan, "belady": Uses(trace)}
    whole, first, seconds = {}, {}, {}
    for policy in policies:
        start = time.perf_counter()
        whole[policy] = simulate(trace, s.sizes, s.capacity, policy,
                                 next_use=uses.get(policy))
        seconds[policy] = time.perf_counter() - start
        first[policy] = simulate(trace[:second], s.sizes, s.capacity, policy,
                                 next_use=uses.get(policy))
    return Compared(len(trace), second, whole, first, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=1536, help="4 MiB chunks in the dataset")
    parser.add_argument("--per-chunk", type=int, default=32, help="samples per chunk")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ratio", type=float, default=1.5, help="dataset / cache")
    args = parser.parse_args()
    s = scenario(args.chunks, args.per_chunk, world=args.world, batch=args.batch,
                 seed=args.seed, ratio=args.ratio)
    got = compare(s)
    print(f"{len(s.sizes)} chunks ({s.nbytes / (1 << 30):.2f} GiB, "
          f"{s.dataset.samples} samples), cache {s.capacity / (1 << 30):.2f} GiB, world "
          f"{args.world}, batch {args.batch}, 2 epochs: {got.reads} chunk reads (epoch 2 "
          f"from read {got.second})")
    print("| policy | hit ratio | source requests | epoch 2 hit ratio | epoch 2 requests |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for policy in POLICIES:
        whole = got.whole[policy]
        ratio, requests = got.second_epoch(policy)
        print(f"| {policy} | {whole.hit_ratio:.3f} | {whole.misses} | {ratio:.3f} | "
              f"{requests} |")


if __name__ == "__main__":
    main()
