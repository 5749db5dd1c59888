"""Metadata operations of two commits side by side, on one PostgreSQL metadata server.

    python -m bench.ab_metadata BEFORE AFTER [--rounds 4] [--n 300]

Each commit is checked out into a temporary git worktree; each round starts a
``stager up`` cluster (one metadata server on a fresh database of one throwaway
PostgreSQL, two data servers) from each worktree in turn, the order reversed
every other round, and times the same operations through that commit's client,
one at a time: an empty file, a 1 KiB file, stat, rename.  Prints the median
us/op of each and after / before.  Not one of ``python -m bench``'s benchmarks:
a tool to see what a change did, on a machine too noisy for figures measured an
hour apart to be compared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from stager.testing.postgres import start_postgres

# Run in each worktree (its own stager on PYTHONPATH): argv = database URL, n.
CHILD = """
import asyncio, json, sys, tempfile, time
from pathlib import Path
from stager.client import AsyncClient
from stager.config import load_config
from stager.testing import ProcessCluster
from stager.testing.cluster import wait_for_targets

async def ops(meta, n):
    c = AsyncClient([meta], config=load_config(env={}))
    out = {}
    await c.mkdir("/seq")
    for name, op in [("empty file", lambda i: c.pipe(f"/seq/f{i:06d}", b"")),
                     ("1 KiB file", lambda i: c.pipe(f"/small/f{i:06d}", b"x" * 1024)),
                     ("stat", lambda i: c.stat(f"/seq/f{i:06d}", cached=False)),
                     ("rename", lambda i: c.rename(f"/seq/f{i:06d}", f"/seq/r{i:06d}"))]:
        start = time.perf_counter()
        for i in range(n):
            await op(i)
        out[name] = (time.perf_counter() - start) / n * 1e6
    await c.close()
    return out

url, n = sys.argv[1], int(sys.argv[2])
with tempfile.TemporaryDirectory() as d:
    with ProcessCluster(Path(d), data_servers=2, fast=False, meta_store=url) as cluster:
        wait_for_targets(cluster.meta_urls[0], 2, timeout=60)
        print(json.dumps(asyncio.run(ops(cluster.meta_urls[0], n))))
"""


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ab_metadata")
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--n", type=int, default=300)
    args = parser.parse_args()
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        for label in ("before", "after"):
            tree = Path(tmp) / label
            subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach",
                            str(tree), getattr(args, label)], check=True)
            trees[label] = tree
        try:
            _rounds(trees, args.rounds, args.n)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force",
                                str(tree)], check=False)


def _rounds(trees: dict[str, Path], rounds: int, n: int) -> dict[str, dict[str, float]]:
    seen: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
    pg = start_postgres()
    try:
        for r in range(rounds):
            for label in (list(trees) if r % 2 == 0 else list(reversed(trees))):
                done = subprocess.run(
                    [sys.executable, "-c", CHILD, pg.create_database(), str(n)],
                    env=dict(os.environ, PYTHONPATH=str(trees[label])), cwd=trees[label],
                    capture_output=True, text=True, timeout=900, check=True)
                seen[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"round {r} {label}: {seen[label][-1]}", file=sys.stderr, flush=True)
    finally:
        pg.destroy()
    medians = {}
    for op in seen["before"][0]:
        before = statistics.median(x[op] for x in seen["before"])
        after = statistics.median(x[op] for x in seen["after"])
        medians[op] = {"before us": round(before), "after us": round(after),
                       "after / before": round(after / before, 2)}
        print(f"{op:12s} before {before:8.0f} us  after {after:8.0f} us  "
              f"after / before {after / before:.2f}")
    return medians


if __name__ == "__main__":
    main()
