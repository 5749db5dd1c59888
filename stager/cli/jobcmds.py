"""``stager jobs``: which training jobs starve for data (live loader telemetry).

Loaders of a named job (``Loader(job=…)`` or ``STAGER_JOB``) report to the
metadata server every few seconds; this lists the jobs worst stall first, each
with its ranks (and DataLoader workers) worst first.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from .filecmds import human, with_client


def _who(rank: int, worker: int | None) -> str:
    return f"rank {rank}" + (f" w{worker}" if worker is not None else "")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def job_line(job: dict[str, Any], now: float) -> str:
    s = job["summary"]
    worst = _who(s["worst"]["rank"], s["worst"]["worker"])
    return (f"{job['job']:<24} {s['state']:<8} {s['ranks']:>3}/{s['world_size']:<4} "
            f"{_pct(s['worst_stall_fraction']):>6} {_pct(s['worst_recent_stall_fraction']):>6} "
            f"{s['samples_per_second']:>10.1f} {worst:<12} "
            f"{max(0.0, now - s['last_report']):.0f}s ago")


def entry_line(e: dict[str, Any]) -> str:
    parts = [f"  {_who(e['rank'], e['worker']):<12} {e.get('host', '?')}:{e.get('pid', '?')}",
             f"stall {_pct(e.get('stall_fraction'))} (now {_pct(e.get('recent_stall_fraction'))})",
             f"{e.get('samples_per_second', 0.0):.1f} samples/s",
             f"{e.get('samples', 0)} samples, {human(e.get('bytes', 0))}",
             f"epoch {e.get('epoch', '?')} cursor {e.get('cursor', '?')}/"
             f"{e.get('dataset_samples', '?')}"]
    if e.get("time_to_first_batch") is None:
        parts.append("no batch yet")
    else:
        parts.append(f"first batch {e['time_to_first_batch']:.2f}s")
    if e.get("waiting_seconds", 0.0) >= 1.0:
        parts.append(f"WAITING {e['waiting_seconds']:.0f}s")
    if e.get("targets"):
        t = e["targets"][0]
        parts.append(f"slowest target {t['target']} {1000 * t.get('mean_latency', 0):.1f} ms")
    if e["state"] == "closed":
        parts.append("closed")
    return ", ".join(parts)


def cmd_jobs(args: argparse.Namespace) -> int:
    jobs = with_client(args, lambda c: c.jobs())
    if args.job:
        jobs = [j for j in jobs if j["job"] == args.job]
    if args.json:
        print(json.dumps(jobs, indent=2))
        return 0
    if not jobs:
        print("no loaders are reporting (Loader(job=...) or STAGER_JOB=name turns reports on)")
        return 0
    now = time.time()
    print(f"{'JOB':<24} {'STATE':<8} {'RANKS':>8} {'STALL':>6} {'NOW':>6} "
          f"{'SAMPLES/S':>10} {'WORST':<12} LAST")
    for job in jobs:        # worst stall first (the server's order)
        print(job_line(job, now))
        for e in sorted(job["ranks"], key=lambda e: -e.get("stall_fraction", 0.0)):
            print(entry_line(e))
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("jobs", help="training jobs' loader telemetry: which ones starve")
    p.add_argument("--job", help="only this job")
    p.add_argument("--json", action="store_true", help="the full reports, as JSON")
    p.set_defaults(func=cmd_jobs)
