"""The CPU bookkeeping of the profile scripts: what each process spent on a piece of work.

On a shared machine the CPU seconds a process spends per file or per GB move
far less than the rate, so every profile prints both, for this process and for
each server process it names.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable

from .common import cpu_seconds


def own_cpu(who: int = resource.RUSAGE_SELF) -> float:
    """CPU seconds of this process (or, ``RUSAGE_CHILDREN``, of its waited-for children)."""
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def measured(pids: dict[str, int], work: Callable[[], object]) -> tuple[float, dict[str, float]]:
    """Run ``work``; its wall seconds and the CPU seconds of each process (and this one)."""
    before = {k: cpu_seconds(p) for k, p in pids.items()}
    mine = own_cpu()
    start = time.perf_counter()
    work()
    wall = time.perf_counter() - start
    used = {k: cpu_seconds(p) - before[k] for k, p in pids.items()}
    used["client"] = own_cpu() - mine
    return wall, used


def report(name: str, count: int, unit: str, wall: float, used: dict[str, float],
           per: int) -> None:
    total = sum(used.values())
    split = ", ".join(f"{k} {per * v / count:.3f}" for k, v in used.items())
    print(f"{name}: {count / wall:,.0f} {unit}/s ({wall:.2f} s); CPU s per {per:,} {unit}: "
          f"{split}; total {per * total / count:.3f} ({total / wall:.2f} cores busy); "
          f"load {os.getloadavg()[0]:.1f}", flush=True)

