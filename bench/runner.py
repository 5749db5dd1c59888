"""Find the benchmarks, run them, and keep their results with the machine's facts."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from stager.testing.locks import NODES_LOCK, exclusive

from . import BENCHMARKS, EMULATE_NODES

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
# Where ``--quick`` writes without ``--out`` (under the working directory): smoke-test
# figures never overwrite the committed ones in bench/results/.
QUICK_OUT = Path(".stager") / "bench-quick"
PACKAGES = ("stager", "aiohttp", "uvloop", "fsspec", "numpy", "crc32c", "pyarrow", "zarr",
            "matplotlib", "torch")
REQUIRED = ("title", "columns", "rows")


def machine_facts() -> dict[str, Any]:
    """What the figures depend on: cores, CPU, kernel, memory, versions, commit, load."""
    return {
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "kernel": platform.release(),
        "memory_gib": round(_mem_total() / (1 << 30), 1),
        "python": platform.python_version(),
        "packages": {p: _version(p) for p in PACKAGES if _version(p)},
        "tools": {t: v for t in ("nginx", "iperf3", "ip") if (v := _tool_version(t))},
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _tool_version(tool: str) -> str | None:
    if shutil.which(tool) is None:
        return None
    flag = {"nginx": "-v", "iperf3": "--version", "ip": "-V"}[tool]
    try:
        proc = subprocess.run([tool, flag], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (proc.stdout + proc.stderr).strip().splitlines()
    return text[0] if text else None


def _git(*args: str) -> str:
    try:
        proc = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def check_result(name: str, result: Any) -> dict[str, Any]:
    """The benchmark's dict, checked against the contract (see ``bench/__init__.py``)."""
    if not isinstance(result, dict):
        raise TypeError(f"bench_{name}.run() returned {type(result).__name__}, not a dict")
    missing = [k for k in REQUIRED if k not in result]
    if missing:
        raise ValueError(f"bench_{name}.run() result lacks {missing}")
    width = len(result["columns"])
    for row in result["rows"]:
        if len(row) != width:
            raise ValueError(f"bench_{name}: row {row!r} has {len(row)} cells, not {width}")
    return result


def run_one(name: str, quick: bool) -> dict[str, Any]:
    module = importlib.import_module(f"bench.bench_{name}")
    facts = machine_facts()
    with exclusive(NODES_LOCK) if name in EMULATE_NODES else contextlib.nullcontext():
        start = time.perf_counter()
        result = check_result(name, module.run(quick))
        seconds = time.perf_counter() - start
    quick_flag = " --quick" if quick else ""
    return {
        "name": name,
        "command": result.get("command") or f"python -m bench {name}{quick_flag}",
        "ratios": {}, "aims": {}, "notes": [],
        **result,
        "quick": quick,
        "seconds": round(seconds, 1),
        "machine": facts,
    }


def write_result(out: Path, result: dict[str, Any]) -> Path:
    """``out/results/<name>.json`` through a temporary file and a rename."""
    path = out / "results" / f"{result['name']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    from .report import render

    names = list(BENCHMARKS)
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="Run stager's benchmarks and render the results.")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"benchmarks to run (default: all): {', '.join(names)}")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes: a smoke test that finishes in a few minutes")
    parser.add_argument("--out", type=Path,
                        help="where results/, RESULTS.md and plots/ go (default: bench/, "
                             f"with --quick {QUICK_OUT}/)")
    parser.add_argument("--render-only", action="store_true",
                        help="only re-render RESULTS.md and the plots from results/")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    out = args.out or (QUICK_OUT if args.quick else BENCH_DIR)
    if args.list:
        print("\n".join(names))
        return 0
    unknown = [n for n in args.names if n not in names]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; known: {names}")
    failed = [] if args.render_only else _run_all(args.names or names, args.quick, out)
    md = render(out)
    print(f"rendered {md}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _run_all(names: list[str], quick: bool, out: Path) -> list[str]:
    failed = []
    for name in names:
        print(f"== {name}{' (quick)' if quick else ''}", flush=True)
        try:
            result = run_one(name, quick)
        except Exception:  # one benchmark failing must not lose the others' results
            traceback.print_exc()
            failed.append(name)
            continue
        path = write_result(out, result)
        print(f"   {result['seconds']} s -> {path}", flush=True)
        for key, value in result["ratios"].items():
            print(f"   {key}: {value}", flush=True)
    return failed
