"""``stager bench``: run the benchmarks of a source checkout (``python -m bench``)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path


def checkout_root() -> Path | None:
    """The repository this stager was imported from, when it has ``bench/``."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "bench" / "runner.py").is_file() else None


def run_bench(args: argparse.Namespace) -> int:
    root = checkout_root()
    if root is None:
        print("stager bench: the benchmarks live in a source checkout (bench/ beside the "
              "stager package); this stager is installed without one. Clone the "
              "repository, `pip install -e '.[bench]'`, and run `stager bench` there.",
              file=sys.stderr)
        return 2
    argv = [sys.executable, "-m", "bench", *args.bench_args]
    return subprocess.call(argv, cwd=root)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("bench", help="run the throughput benchmarks (from a source checkout)",
                       description="Runs `python -m bench` in the checkout: "
                                   "[NAME ...] [--quick] [--out DIR] [--list].",
                       # every argument, options included, goes to `python -m bench`
                       prefix_chars="\x00", add_help=False)
    p.add_argument("bench_args", nargs=argparse.REMAINDER,
                   help="passed to `python -m bench` (try --help)")
    p.set_defaults(func=run_bench)
