"""CPU per batched heartbeat on a PostgreSQL store (issue 30): the metadata server's and
the database's.

A metadata server (``stager up --data-servers 0 --meta-store postgresql://...``, a
throwaway PostgreSQL) is sent ``POST /v1/heartbeats`` batches of ``--per-server``
targets (or, with ``--reports``, ``POST /v1/jobs/reports`` batches of as many loader
ranks' reports), back to back from ``--senders`` concurrent senders, for ``--window`` seconds
after a warm-up.  The metadata server's CPU (its process) and PostgreSQL's (the
postmaster and its children: the pool's backends, the WAL writer, ...) are read from
``/proc`` around the window and divided by the beats served.  Run it from two trees
(``PYTHONPATH=OLD_TREE``) to set two versions side by side.

    python -m bench.profile_pg_beats [--targets 256] [--per-server 8] [--window 10] [--reports]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from stager.protocol.routes import route
from stager.testing import ProcessCluster
from stager.testing.postgres import start_postgres

from .common import cpu_seconds


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and of its live children (PostgreSQL's processes)."""
    total = cpu_seconds(root)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(") ", 1)[1].split()
                if int(stat[1]) == root:
                    total += cpu_seconds(int(entry))
            except (OSError, IndexError):
                continue
    return total


async def load(meta: str, args: argparse.Namespace, pids: tuple[int, int]) -> dict[str, Any]:
    ids = [f"t-pg{i:05d}" for i in range(args.targets)]
    beat = {"capacity": 4 << 40, "used": 1 << 30, "chunks": 100, "bytes_read": 0,
            "bytes_written": 0}
    bodies = [{"items": [{"target_id": t, "heartbeat": beat}
                         for t in ids[i:i + args.per_server]]}
              for i in range(0, len(ids), args.per_server)]
    path = route("heartbeats").url(meta)
    if args.reports:        # a node's loader ranks, one report each, instead
        report = {"interval": 5.0, "world_size": args.targets, "samples": 1000,
                  "stall_fraction": 0.01, "samples_per_second": 2000.0}
        bodies = [{"items": [{"job": "pg", "rank": r, "report": report}
                             for r in range(i, min(i + args.per_server, args.targets))]}
                  for i in range(0, args.targets, args.per_server)]
        path = route("report_ranks").url(meta)
    async with aiohttp.ClientSession() as s:
        for i, t in enumerate(ids):
            async with s.post(route("register_target").url(meta), json={
                    "id": t, "node": f"sim{i // args.per_server}",
                    "url": f"http://127.0.0.2:{20000 + i}", "capacity": 4 << 40}) as r:
                assert r.status == 200, await r.text()
        served = {"beats": 0, "on": False}

        async def sender(k: int, until: float) -> None:
            n = k
            while time.monotonic() < until:
                async with s.post(path, json=bodies[n % len(bodies)]) as r:
                    await r.read()
                    assert r.status == 200
                if served["on"]:
                    served["beats"] += args.per_server
                n += args.senders

        start = time.monotonic()
        until = start + args.warmup + args.window
        senders = [asyncio.ensure_future(sender(k, until)) for k in range(args.senders)]
        await asyncio.sleep(args.warmup)
        served["on"] = True
        cpu0 = (cpu_seconds(pids[0]), tree_cpu(pids[1]), time.monotonic())
        await asyncio.gather(*senders)
        cpu1 = (cpu_seconds(pids[0]), tree_cpu(pids[1]), time.monotonic())
    beats = served["beats"]
    return {"beats": beats, "seconds": round(cpu1[2] - cpu0[2], 2),
            "beats_per_s": round(beats / (cpu1[2] - cpu0[2])),
            "meta_us_per_beat": round(1e6 * (cpu1[0] - cpu0[0]) / beats, 1),
            "pg_us_per_beat": round(1e6 * (cpu1[1] - cpu0[1]) / beats, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--targets", type=int, default=256)
    p.add_argument("--per-server", type=int, default=8)
    p.add_argument("--senders", type=int, default=4)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--window", type=float, default=10.0)
    p.add_argument("--reports", action="store_true",
                   help="batches of loader reports (POST /v1/jobs/reports) instead")
    args = p.parse_args()
    pg = start_postgres()
    try:
        url = pg.create_database()
        postmaster = int((pg.data / "postmaster.pid").read_text().split()[0])
        with tempfile.TemporaryDirectory() as tmp, ProcessCluster(
                Path(tmp) / "c", data_servers=0, fast=False, meta_store=url,
                env={"STAGER_TARGET_TIMEOUT": "3600"}) as cluster:
            out = asyncio.run(load(cluster.meta_url, args, (cluster.meta_pid(), postmaster)))
        print(json.dumps({**vars(args), **out}))
    finally:
        pg.destroy()


if __name__ == "__main__":
    main()
