"""Smoke test of the benchmark suite: the README's ``python -m bench --quick``, verbatim.

It runs every benchmark of :data:`bench.BENCHMARKS` at its smallest size and must
produce figures, not reach the aims.  It runs in a temporary working directory, so
the quick results land in its ``.stager/bench-quick`` and the committed results in
bench/ are never touched.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from test_bench_cache import check_quick_cluster_rows

from bench import BENCHMARKS, EMULATE_NODES

# In the slurm group, so one worker runs it and the group's modules one after another:
# beside them, the benchmarks that start nodes and namespaces (bench.EMULATE_NODES) each
# waited for the nodes lock that a module of the group held on the other worker (100 s
# in one CI run), their worker idle.  This module does not hold that lock
# (tests/conftest.py): the benchmark runner takes it around each of those benchmarks.
pytestmark = pytest.mark.xdist_group("slurm")
NODES_IN_TURN = False

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def _numbers(rows: list[list[object]]) -> list[float]:
    return [float(c) for row in rows for c in row
            if isinstance(c, int | float) and not isinstance(c, bool)]


def readme_bench_commands() -> list[list[str]]:
    """Every ``python -m bench …`` the README shows: on a console line or inline
    (``python -m bench NAME``); not the synopsis with ``[NAME…]``."""
    text = README.read_text()
    lines = re.findall(r"^\$ (python -m bench\b.*)$", text, re.M)
    inline = [c for c in re.findall(r"`(python -m bench\b[^`]*)`", text) if "[" not in c]
    return [shlex.split(line, comments=True) for line in lines + inline]


def bench(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``argv`` as a user types it in ``cwd``, with the checkout's ``bench`` importable."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable if a == "python" else a for a in argv], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_readme_quick_command_runs_every_benchmark(tmp_path: Path) -> None:
    quick = [c for c in readme_bench_commands() if c[3:] == ["--quick"]]
    assert quick, "README.md no longer shows `python -m bench --quick`"
    committed = {p: p.stat().st_mtime_ns for p in (REPO / "bench" / "results").iterdir()}
    proc = bench(quick[0], tmp_path, 1440)     # its node benchmarks may wait their turns
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = tmp_path / ".stager" / "bench-quick"
    for name in BENCHMARKS:
        result = json.loads((out / "results" / f"{name}.json").read_text())
        assert result["name"] == name and result["quick"] is True
        assert result["rows"], f"{name}: no rows ({result['notes'][:1]})"
        assert all(len(r) == len(result["columns"]) for r in result["rows"])
        numbers = _numbers(result["rows"])
        assert numbers and all(math.isfinite(x) for x in numbers)
        assert any(x > 0 for x in numbers)
        assert all(isinstance(v, int | float) and v > 0 for v in result["ratios"].values())
        machine = result["machine"]
        assert machine["cores"] >= 1 and machine["kernel"] and machine["python"]
        assert machine["packages"]["aiohttp"] and machine["date"]
        assert (out / "plots" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    # the cache benchmark's cluster parts, checked here rather than run again
    check_quick_cluster_rows(json.loads((out / "results" / "cache.json").read_text()))
    md = (out / "RESULTS.md").read_text()
    for name in BENCHMARKS:
        assert f'<a id="{name}"></a>' in md
        assert f"python -m bench {name} --quick" in md
    assert "MB/s" in md and "samples/s" in md
    assert {p: p.stat().st_mtime_ns for p in (REPO / "bench" / "results").iterdir()} == committed

    # Text written outside the generated block survives a re-render.
    (out / "RESULTS.md").write_text(md + "\nA hand-written before/after table.\n")
    bench(["python", "-m", "bench", "--render-only", "--quick"], tmp_path, 120)
    again = (out / "RESULTS.md").read_text()
    assert again.count("A hand-written before/after table.") == 1
    assert again.count('<a id="loopback"></a>') == 1


def test_the_readme_full_size_commands_name_benchmarks() -> None:
    """The README's full-size commands (minutes each) are not run here; every name in
    them is a benchmark, which the quick run above runs."""
    commands = readme_bench_commands()
    assert len(commands) >= 3
    for argv in commands:
        assert argv[:3] == ["python", "-m", "bench"], argv
        names = [a for a in argv[3:] if not a.startswith("-")]
        assert set(names) <= set(BENCHMARKS), argv


def test_the_benchmarks_that_start_nodes_take_their_turn() -> None:
    """A benchmark that starts emulated nodes, namespaces or per-job clusters is in
    bench.EMULATE_NODES, so the runner holds the nodes lock around it: the quick run
    shares the machine with the Slurm group's modules (tests/conftest.py)."""
    harness = re.compile(r'NetnsFabric\(|EmulatedJob\(|NodeCluster\((?![^\n]*mode="loopback")'
                         r"|from \.cache_cluster import")
    starting = {p.stem.removeprefix("bench_") for p in (REPO / "bench").glob("bench_*.py")
                if harness.search(p.read_text())}
    assert starting & set(BENCHMARKS) == EMULATE_NODES


def test_the_registry_is_every_benchmark_module_and_no_helper() -> None:
    """A module named like a benchmark but without ``run`` (bench_metadata_pg.py, the
    store rows of ``metadata``) is a helper: never run as a benchmark."""
    modules = {p.stem.removeprefix("bench_") for p in (REPO / "bench").glob("bench_*.py")}
    runnable = {m for m in modules
                if callable(getattr(importlib.import_module(f"bench.bench_{m}"), "run", None))}
    assert set(BENCHMARKS) == runnable and len(BENCHMARKS) == len(runnable)
    assert "metadata_pg" in modules - runnable
    listed = bench(["python", "-m", "bench", "--list"], REPO, 60)
    assert listed.stdout.split() == list(BENCHMARKS)


def test_unknown_benchmark_is_a_clear_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", "no_such", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown benchmark" in proc.stderr
    assert not (tmp_path / "results").exists()


def test_small_figures_keep_two_significant_digits() -> None:
    """A stat rate 250 times under local is a ratio of 0.004, not 0."""
    from bench.common import r2

    assert r2(0.00398) == 0.004 and r2(-0.0123) == -0.012
    assert r2(1.234) == 1.23 and r2(0.0) == 0.0 and r2(12345.678) == 12345.68
