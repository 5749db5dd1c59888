"""The mount's read path under a profiler: ``python -m bench.profile_mount [options]``.

Four data servers on loopback, one 1 GiB file, one ``stager mount``; then, round
by round, the file read front to back through the mount (its cached pages
dropped first, untimed: the "drop" line, so every byte crosses FUSE) and through
the client library's readahead stream, side by side, and at the end the median
of each.  Each line gives MB/s and the CPU seconds per GB of every process that
took part: the reader (this process), the mount daemon, the servers (from
``/proc/PID/stat``, user + system), so the cost of the extra hop is visible
apart from the noise of a shared machine.

A/B in one run: ``--compare 'K=V ...'`` adds a second mount whose daemon gets
that environment (``STAGER_READAHEAD_CHUNKS=3``, or ``PYTHONPATH=/tmp/old`` for
another copy of the code), ``--compare-arg`` one with extra ``stager mount``
options (``--kernel-readahead=8MiB``); both are read in turn.  ``--block`` is
the reader's ``read()`` size.  Profile a daemon with::

    python -m bench.profile_mount --wait 5 --pids /tmp/pids.json --rounds 10 &
    py-spy record --native -r 200 -o mount.svg --pid $(jq .mount /tmp/pids.json) -d 20
    perf record -g -p $(jq .mount /tmp/pids.json) -- sleep 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from stager.config import parse_size
from stager.testing.mount import Mounted
from stager.testing.nodes import NodeCluster

from .common import (
    cpu_seconds,
    drain,
    drop_cache,
    interleaved,
    median,
    new_client,
    read_file,
    scratch,
    upload_file,
    write_local,
)


def measure(name: str, fn: Callable[[], int], pids: dict[str, list[int]]) -> dict[str, float]:
    """Run ``fn`` (it returns bytes read); MB/s and CPU s/GB of each group of processes."""
    before = {k: sum(cpu_seconds(p) for p in v) for k, v in pids.items()}
    cpu, start = time.process_time(), time.perf_counter()
    n = fn()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    gb = n / 1e9
    out = {"MB/s": gb * 1e3 / seconds, "reader": cpu / gb}
    for k, v in pids.items():
        out[k] = (sum(cpu_seconds(p) for p in v) - before[k]) / gb
    out["total"] = sum(x for k, x in out.items() if k != "MB/s")
    print(f"{name:8} {out['MB/s']:7.0f} MB/s   CPU s/GB: "
          + "  ".join(f"{k} {x:.3f}" for k, x in out.items() if k != "MB/s"), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profile_mount", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="1GiB")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--block", default="1MiB", help="the reader's read() size")
    p.add_argument("--mount-arg", action="append", default=[], help="for stager mount")
    p.add_argument("--compare", metavar="'K=V ...'",
                   help="a second mount, its daemon started with these environment "
                        "settings (e.g. 'STAGER_READAHEAD_CHUNKS=2'), read in turn")
    p.add_argument("--compare-arg", action="append", default=[],
                   help="a second mount with these extra stager mount options (repeatable)")
    p.add_argument("--no-client", action="store_true", help="only read through the mount")
    p.add_argument("--pids", type=Path, help="write the pids here (JSON)")
    p.add_argument("--wait", type=float, default=0.0, help="seconds to wait before reading")
    args = p.parse_args()
    size, block = parse_size(args.size), parse_size(args.block)
    mount_args = {"mount": ({}, args.mount_arg)}
    if args.compare or args.compare_arg:
        env = dict(kv.split("=", 1) for kv in (args.compare or "").split())
        mount_args["mount-b"] = (env, args.mount_arg + args.compare_arg)
    with scratch("profile-mount") as tmp, contextlib.ExitStack() as stack:
        local = write_local(tmp / "data.bin", size)
        cluster = stack.enter_context(NodeCluster(tmp / "cluster", 4, mode="loopback"))
        asyncio.run(_load(cluster.meta_url, local))
        mounts = {name: stack.enter_context(Mounted(
            cluster.meta_url, tmp / name, args=("--read-only", *extra), env=env))
            for name, (env, extra) in mount_args.items()}
        servers = [q.pid for q in cluster.procs]
        if args.pids:
            args.pids.write_text(json.dumps({"reader": os.getpid(), "servers": servers,
                                             **{k: m.pid for k, m in mounts.items()}}))
        cases: dict[str, Callable[[], dict[str, float]]] = {}
        for name, m in mounts.items():
            assert m.pid is not None
            pids = {"daemon": [m.pid], "servers": servers}
            path = m.mountpoint / "data.bin"
            drop_cache(path)
            read_file(path, block)                    # warm-up
            cases[f"{name} drop"] = functools.partial(
                measure, "drop", lambda path=path: (drop_cache(path), size)[1], pids)
            cases[name] = functools.partial(
                measure, name, lambda path=path: read_file(path, block), pids)
        if not args.no_client:
            cases["stream"] = functools.partial(
                measure, "stream", lambda: asyncio.run(_stream(cluster.meta_url)),
                {"servers": servers})
        time.sleep(args.wait)
        results = interleaved(args.rounds, cases)
        print("median of", args.rounds, "rounds:")
        for name, runs in results.items():
            keys = runs[0].keys()
            print(f"  {name:12} " + "  ".join(
                f"{k} {median([r[k] for r in runs]):.3f}" for k in keys))
        for name, m in mounts.items():
            print(name, json.dumps({k: v for k, v in m.stats().items() if k != "targets"}))


async def _load(meta_url: str, local: Path) -> None:
    async with new_client(meta_url) as c:
        await upload_file(c, local, "/data.bin")


async def _stream(meta_url: str) -> int:
    async with new_client(meta_url) as c:
        return await drain(c, "/data.bin")


if __name__ == "__main__":
    main()
