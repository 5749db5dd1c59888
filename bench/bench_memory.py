"""Memory: peak RSS of a client process reading many GiB with default settings.

A fresh process per reader reads one striped file again and again until it has
read ``total`` bytes, then reports its peak resident set (``VmHWM``, which
includes the interpreter and its imports) and its RSS before the first read.
Readers: the sync file API (``Client.open().read(8 MiB)``) and the async
readahead stream.  The aim: peak under 1 GiB.
"""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from stager.testing.nodes import NodeCluster

from .common import GiB, MiB, aim, new_client, r2, run_async, scratch, upload_file, write_local

LIMIT = 1 * GiB
DATA_SERVERS = 4


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()


def _peak_rss() -> int:
    """This process's peak resident set (VmHWM).  Not ``ru_maxrss``: on Linux that
    keeps the peak of the process image before ``exec``, i.e. of the (large)
    benchmark process this child was forked from."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(meta_url: str, mode: str, total: int) -> dict[str, Any]:
    """Runs in the measured process."""
    from stager import Client
    from stager.config import load_config

    read = 0
    start = time.perf_counter()
    if mode == "file":
        with Client(meta_url, config=load_config(env={})) as c:
            c.stat("/data.bin")
            before = _rss()
            while read < total:
                with c.open("/data.bin") as fh:
                    while data := fh.read(8 * MiB):
                        read += len(data)
    else:
        async def stream() -> int:
            nonlocal read
            async with new_client(meta_url) as c:
                info = await c.stat("/data.bin")
                rss = _rss()
                while read < total:
                    async for piece in c.reader(info).stream():
                        read += len(piece)
                return rss
        before = asyncio.run(stream())
    seconds = time.perf_counter() - start
    peak = _peak_rss()
    return {"read": read, "seconds": seconds, "rss_before": before, "peak_rss": peak}


def measure(meta_url: str, mode: str, total: int) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "bench.bench_memory", meta_url, mode,
                           str(total)], capture_output=True, text=True, timeout=1800,
                          cwd=Path(__file__).resolve().parent.parent)
    if proc.returncode != 0:
        raise RuntimeError(f"memory child failed: {proc.stderr[-2000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def run(quick: bool) -> dict[str, Any]:
    # --quick: still a file read four times over, half the bytes of before
    size = 64 * MiB if quick else 1 * GiB
    total = 256 * MiB if quick else 10 * GiB
    with scratch("memory") as tmp:
        local = write_local(tmp / "data.bin", size)
        with NodeCluster(tmp / "cluster", DATA_SERVERS, mode="loopback") as cluster:
            run_async(_load(cluster.meta_url, local))
            figures = {
                "Client.open().read(8 MiB)": measure(cluster.meta_url, "file", total),
                "AsyncClient reader.stream()": measure(cluster.meta_url, "stream", total),
            }
    return _result(figures, size, total, quick)


async def _load(meta_url: str, local: Path) -> None:
    async with new_client(meta_url) as c:
        await upload_file(c, local, "/data.bin")


def _result(figures: dict[str, dict[str, Any]], size: int, total: int,
            quick: bool) -> dict[str, Any]:
    rows = [[name, round(f["read"] / GiB, 2), r2(f["rss_before"] / MiB),
             r2(f["peak_rss"] / MiB), r2(f["read"] / f["seconds"] / 1e6)]
            for name, f in figures.items()]
    worst = max(f["peak_rss"] for f in figures.values())
    return {
        "title": f"Memory: peak RSS of a client reading {total / GiB:g} GiB",
        "command": "python -m bench memory" + (" --quick" if quick else ""),
        "columns": ["reader", "GiB read", "RSS before reading MiB", "peak RSS MiB",
                    "MB/s"],
        "rows": rows,
        "ratios": {"worst peak RSS / 1 GiB": r2(worst / LIMIT)},
        "aims": {"worst peak RSS (MiB)": aim(worst / MiB, "< 1024", worst < LIMIT)},
        "notes": [
            f"A {size // MiB} MiB file on {DATA_SERVERS} loopback data servers read "
            f"repeatedly by a fresh process per reader, default settings (16 requests in "
            "flight, 8 chunks of readahead, 4 MiB chunks).",
            "Peak RSS is the process's VmHWM (high-water mark of its resident set): "
            "interpreter, imports and buffers.",
        ],
        "plot": {"kind": "barh", "x": "reader", "y": ["peak RSS MiB"], "ylabel": "MiB"},
    }


if __name__ == "__main__":
    print(json.dumps(child(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
