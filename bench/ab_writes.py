"""The write rows of two commits side by side: ``put`` of a large file and
``write_many`` of small files, both with two replicas.

    python -m bench.ab_writes BEFORE AFTER [--rounds 4] [--mib 1024] [--files 4000]

Each round starts 4 loopback data servers (as ``python -m bench writes`` does) from
each commit's worktree in turn (:mod:`bench.ab`) and times, through that commit's
client with default settings: one ``put`` of a ``--mib`` MiB file from the page
cache (4 MiB chunks, R=2), and one ``write_many`` of ``--files`` files of 8 KiB
(R=2, batches as the client makes them).  After a warm-up of each.  Prints the
median MB/s and files/s, the client's own CPU time for each (steadier than wall
time on a shared machine: the servers run in other processes), and after / before.
"""

from __future__ import annotations

import argparse

from .ab import interleave, worktrees

# Run in each worktree (its own stager on PYTHONPATH): argv = MiB, files.
CHILD = """
import asyncio, json, os, sys, tempfile, time
from pathlib import Path
from stager.client import AsyncClient
from stager.config import load_config
from stager.protocol.models import LayoutSpec
from stager.testing.nodes import NodeCluster

R2 = LayoutSpec(replicas=2)

async def once(meta, local, files, k):
    async with AsyncClient(meta, config=load_config(env={})) as c:
        start, cpu = time.perf_counter(), time.process_time()
        await c.put(local, f"/big{k}", layout=R2)
        put = local.stat().st_size / (time.perf_counter() - start) / 1e6
        put_cpu = (time.process_time() - cpu) / (local.stat().st_size / 2**30)
        body = os.urandom(8192)
        items = [(f"/small{k}/f{i:06d}", body) for i in range(files)]
        start, cpu = time.perf_counter(), time.process_time()
        results = await c.write_many(items, layout=R2)
        many = files / (time.perf_counter() - start)
        many_cpu = (time.process_time() - cpu) / files * 1e6
        assert not [r for r in results if isinstance(r, Exception)]
        await c.rm(f"/big{k}")
        await c.rm(f"/small{k}", recursive=True)
    return {"put 1 file, R=2: MB/s": put, "put: client CPU s/GiB": put_cpu,
            "write_many 8 KiB, R=2: files/s": many, "write_many: client CPU us/file": many_cpu}

mib, files = int(sys.argv[1]), int(sys.argv[2])
with tempfile.TemporaryDirectory() as d:
    local = Path(d) / "src.bin"
    with open(local, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))
    with NodeCluster(Path(d) / "cluster", 4, mode="loopback") as cluster:
        asyncio.run(once(cluster.meta_url, local, files, 0))      # warm-up
        print(json.dumps(asyncio.run(once(cluster.meta_url, local, files, 1))))
"""


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ab_writes")
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--files", type=int, default=4000)
    args = parser.parse_args()
    with worktrees(before=args.before, after=args.after) as trees:
        interleave(trees, args.rounds, CHILD, lambda: [str(args.mib), str(args.files)])


if __name__ == "__main__":
    main()
