"""What holds a metadata server's event loop under bench scale's load, and for how long.

``python -m bench.profile_holds [--targets N] [--ranks N] [--window S]`` starts a
metadata server (``ProcessCluster``, SQLite, default intervals, the asyncio loop: the
hook needs its Python callbacks) with :mod:`bench.holds_hook` loaded, registers N
targets, then sends bench scale's combined load (N targets batched 8 a request, N ranks
batched 8 a request, at their real cadence) from a child process and prints, per kind of
callback, how many ran and their thread CPU (p50, p99, max, total), and the same for
garbage collections by generation.  A stat arriving while one runs waits for it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from stager.testing import ProcessCluster

from . import bench_scale
from .common import run_async, scratch

HOOK = Path(__file__).resolve().parent / "holds_hook"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--targets", type=int, default=4000)
    parser.add_argument("--ranks", type=int, default=2000)
    parser.add_argument("--window", type=float, default=10.0)
    args = parser.parse_args(argv)
    with scratch("holds") as tmp:
        prefix = str(tmp / "holds")
        path = os.pathsep.join(p for p in (str(HOOK), os.environ.get("PYTHONPATH", ""),
                                           str(HOOK.parent.parent)) if p)
        env = {"STAGER_TARGET_TIMEOUT": "3600", "STAGER_EVENT_LOOP": "asyncio",
               "STAGER_HOLDS": prefix, "PYTHONPATH": path,
               "STAGER_UP_EXEC": "1"}     # the hook starts with the server's interpreter
        with ProcessCluster(tmp / "cluster", data_servers=0, fast=False, env=env) as cluster:
            meta = cluster.meta_url
            bench_scale._generate_in_child(meta, {"register": args.targets}, 0.0, 0.0)
            run_async(bench_scale._mkdir(meta))
            Path(prefix + ".reset").touch()      # the hook empties its record...
            time.sleep(2.5)                      # ...on its next write
            counts = bench_scale._generate_in_child(
                meta, {"batched": args.targets, "ranks_batched": args.ranks}, 0.0,
                args.window)
            time.sleep(2.5)                      # the hook's last write
            held = json.loads(Path(f"{prefix}.{cluster.meta_pid()}.json").read_text())
    print(f"load: {counts}")
    print(f"{'callback':60s} {'n':>7s} {'p50 us':>8s} {'p99 us':>8s} {'max us':>8s} "
          f"{'total s':>8s}")
    for kind, h in sorted(held.items(), key=lambda kv: -kv[1]["seconds"])[:20]:
        print(f"{kind[:60]:60s} {h['n']:7d} {h['p50_us']:8.0f} {h['p99_us']:8.0f} "
              f"{h['max_us']:8.0f} {h['seconds']:8.2f}")


if __name__ == "__main__":
    main()
