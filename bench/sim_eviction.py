"""Eviction policies on issue 28's scenario, simulated: ``python -m bench.sim_eviction``.

A simulation of the policies (:mod:`stager.eviction`), not a measurement of the
servers, hence not one of :data:`bench.BENCHMARKS`.  The scenario: a dataset
1.5x the cache, read for two shuffled epochs by a Loader with world size 2 and
the default order (``window_of_blocks``, a block per chunk as the tar format
gives, the Loader's default window of 8 blocks).  The trace is every rank's
chunk reads in step order (each chunk once per batch), derived from the plan by
:func:`stager.plans.accesses.plan_accesses`; ``plan`` evicts by that plan's
next uses, ``belady`` by the trace's own (the offline optimum).

Printed per policy: the hit ratio of chunk reads and the source fetches, over
both epochs and over the second alone (the first fetches every chunk once
whatever the policy), then plan/belady and plan/lru.  A chunk is read by about
eight batches of its shuffle window in a row, and all but the first of those
reads hit under every policy, so the hit ratios sit close together; the
policies differ in the second epoch's source fetches.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from stager.eviction import Simulated, Uses, simulate
from stager.plans.accesses import plan_accesses
from stager.plans.order import regular_blocks

MiB = 1 << 20
POLICIES = ("lru", "s3fifo", "plan", "belady")


def scenario(chunks: int, per_chunk: int, world: int, batch: int, seed: int
             ) -> tuple[np.ndarray, int]:
    """(the trace of chunk keys, where the second epoch starts in it)."""
    samples = chunks * per_chunk
    accesses = plan_accesses(np.arange(samples) // per_chunk,
                             block_starts=regular_blocks(samples, per_chunk),
                             batch_size=batch, world_size=world, epochs=(0, 1),
                             window=8 * per_chunk, seed=seed)
    steps_per_epoch = samples // (world * batch)
    return accesses.key, int(np.searchsorted(accesses.step, steps_per_epoch))


def row(name: str, whole: Simulated, first: Simulated, seconds: float) -> list[str]:
    hits, misses = whole.hits - first.hits, whole.misses - first.misses
    return [name, f"{whole.hit_ratio:.3f}", f"{whole.misses}",
            f"{hits / max(1, hits + misses):.3f}", f"{misses}", f"{seconds:.2f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=1536, help="4 MiB chunks in the dataset")
    parser.add_argument("--per-chunk", type=int, default=32, help="samples per chunk")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ratio", type=float, default=1.5, help="dataset / cache")
    args = parser.parse_args()

    trace, second = scenario(args.chunks, args.per_chunk, args.world, args.batch, args.seed)
    sizes = np.full(args.chunks, 4 * MiB, dtype=np.int64)
    capacity = int(args.chunks / args.ratio) * 4 * MiB
    uses = Uses(trace)          # plan's uses and the trace's are the same list here
    print(f"{args.chunks} chunks of 4 MiB ({args.chunks * 4 / 1024:.1f} GiB), cache "
          f"{capacity / (1 << 30):.1f} GiB, world {args.world}, batch {args.batch}, "
          f"2 epochs: {len(trace)} chunk reads (epoch 2 from read {second})")
    columns = ["policy", "hit ratio", "source fetches", "epoch 2 hit ratio",
               "epoch 2 fetches", "sim s"]
    rows, results = [], {}
    for name in POLICIES:
        next_use = uses if name in ("plan", "belady") else None
        start = time.perf_counter()
        whole = simulate(trace, sizes, capacity, name, next_use=next_use)
        seconds = time.perf_counter() - start
        first = simulate(trace[:second], sizes, capacity, name, next_use=next_use)
        results[name] = (whole, first)
        rows.append(row(name, whole, first, seconds))
    print("| " + " | ".join(columns) + " |")
    print("|" + " --- |" + " ---: |" * (len(columns) - 1))
    for r in rows:
        print("| " + " | ".join(r) + " |")

    def ratio(a: str, b: str) -> str:
        (wa, fa), (wb, fb) = results[a], results[b]
        second_a = (wa.hits - fa.hits) / max(1, wa.hits - fa.hits + wa.misses - fa.misses)
        second_b = (wb.hits - fb.hits) / max(1, wb.hits - fb.hits + wb.misses - fb.misses)
        fetch_a, fetch_b = wa.misses - fa.misses, wb.misses - fb.misses
        return (f"{a}/{b}: hit ratio {wa.hit_ratio / wb.hit_ratio:.3f}, epoch 2 hit ratio "
                f"{second_a / max(second_b, 1e-9):.3f}; epoch 2 source fetches {fetch_a} vs "
                f"{fetch_b} ({fetch_b / max(1, fetch_a):.2f}x as many for {b})")
    print(ratio("plan", "belady"))
    print(ratio("plan", "lru"))


if __name__ == "__main__":
    main()
