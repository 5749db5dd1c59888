"""Metadata operations of two commits side by side, on one PostgreSQL metadata server.

    python -m bench.ab_metadata BEFORE AFTER [--rounds 4] [--n 300]

Each round starts a ``stager up`` cluster (one metadata server on a fresh
database of one throwaway PostgreSQL, two data servers) from each commit's
worktree in turn (:mod:`bench.ab`), and times the same operations through that
commit's client, one at a time: an empty file, a 1 KiB file, stat, rename.
Prints the median us/op of each and after / before.
"""

from __future__ import annotations

import argparse

from stager.testing.postgres import start_postgres

from .ab import interleave, worktrees

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
    pg = start_postgres()
    try:
        with worktrees(before=args.before, after=args.after) as trees:
            interleave(trees, args.rounds, CHILD, lambda: [pg.create_database(), str(args.n)])
    finally:
        pg.destroy()


if __name__ == "__main__":
    main()
