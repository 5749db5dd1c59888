"""Writes: ``put`` of one file with 1 and 2 replicas, against a local durable write.

Four data servers on loopback, each its own node, so two replicas land on two
nodes.  Every chunk is durable (fsync, rename, fsync of the directory) on every
replica before the client counts it.  Baseline in the same run: writing the
same bytes to a local file with an fsync every 4 MiB (the same durability as a
chunk).  Rounds are interleaved; the source file sits in the page cache.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from stager.protocol.models import LayoutSpec
from stager.testing.nodes import NodeCluster

from .common import (
    GiB,
    MiB,
    interleaved,
    median,
    new_client,
    r2,
    rate,
    run_async,
    scratch,
    write_local,
)

DATA_SERVERS = 4
CHUNK = 4 * MiB


async def stager_put(meta_url: str, local: Path, replicas: int, k: int) -> float:
    async with new_client(meta_url) as c:
        start = time.perf_counter()
        await c.put(local, f"/w{replicas}-{k}", layout=LayoutSpec(replicas=replicas))
        seconds = time.perf_counter() - start
        await c.rm(f"/w{replicas}-{k}")   # keep the disk from filling over the rounds
    return rate(local.stat().st_size, seconds)


def local_durable(src: Path, dst: Path) -> float:
    """Copy ``src`` to ``dst`` with an fsync after every 4 MiB."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    start = time.perf_counter()
    with open(src, "rb", buffering=0) as fin, open(dst, "wb", buffering=0) as fout:
        while n := fin.readinto(view):
            fout.write(view[:n])
            os.fsync(fout.fileno())
    seconds = time.perf_counter() - start
    dst.unlink()
    return rate(src.stat().st_size, seconds)


def run(quick: bool) -> dict[str, Any]:
    size = 64 * MiB if quick else 1 * GiB
    rounds = 2 if quick else 3
    with scratch("writes") as tmp:
        local = write_local(tmp / "src.bin", size)
        with NodeCluster(tmp / "cluster", DATA_SERVERS, mode="loopback") as cluster:
            counter = iter(range(1_000_000))
            cases = {
                "stager put, replicas=1": lambda: run_async(
                    stager_put(cluster.meta_url, local, 1, next(counter))),
                "stager put, replicas=2": lambda: run_async(
                    stager_put(cluster.meta_url, local, 2, next(counter))),
                "local write, fsync every 4 MiB": lambda: local_durable(local, tmp / "copy"),
            }
            for case in cases.values():   # warm up: connections, page cache, directories
                case()
            figures = interleaved(rounds, cases)
    return _result(figures, size, rounds, quick)


def _result(figures: dict[str, list[float]], size: int, rounds: int,
            quick: bool) -> dict[str, Any]:
    med = {k: median(v) for k, v in figures.items()}
    r1, r2_, loc = (med["stager put, replicas=1"], med["stager put, replicas=2"],
                    med["local write, fsync every 4 MiB"])
    rows = [[name, r2(value), r2(value / loc), " / ".join(f"{x:.0f}" for x in figures[name])]
            for name, value in med.items()]
    return {
        "title": "Writes: put with 1 and 2 replicas",
        "command": "python -m bench writes" + (" --quick" if quick else ""),
        "columns": ["writer", "MB/s (median)", "x local durable write", "MB/s per round"],
        "rows": rows,
        "ratios": {"replicas=2 / replicas=1": r2(r2_ / r1),
                   "replicas=1 / local durable write": r2(r1 / loc),
                   "replicas=2 / local durable write": r2(r2_ / loc)},
        "aims": {},
        "notes": [
            f"{size // MiB} MiB file from the page cache, {DATA_SERVERS} data servers on "
            f"loopback (all on this machine's one disk), 4 MiB chunks, default client "
            f"settings (8 chunks in flight); median of {rounds} interleaved rounds after a "
            "warm-up round.",
            "With 2 replicas every byte crosses loopback and reaches the disk twice; on "
            "one machine both copies share the same disk and cores.",
        ],
        "plot": {"kind": "barh", "x": "writer", "y": ["MB/s (median)"], "ylabel": "MB/s"},
    }
