"""Smoke test of the benchmark suite: ``python -m bench --quick`` into a temporary dir.

It must run and produce figures, not reach the aims.  The committed results in
bench/ are never touched (``--out``).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OURS = ["striping", "loopback", "small_samples", "metadata", "writes", "write_failover",
        "memory", "auth", "jobstart", "jobcluster"]


def _numbers(rows: list[list[object]]) -> list[float]:
    return [float(c) for row in rows for c in row
            if isinstance(c, int | float) and not isinstance(c, bool)]


def test_quick_suite_writes_results_markdown_and_plots(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", *OURS, "--quick", "--out",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    for name in OURS:
        result = json.loads((tmp_path / "results" / f"{name}.json").read_text())
        assert result["name"] == name and result["quick"] is True
        assert result["rows"] and all(len(r) == len(result["columns"]) for r in result["rows"])
        numbers = _numbers(result["rows"])
        assert numbers and all(math.isfinite(x) for x in numbers)
        assert any(x > 0 for x in numbers)
        assert all(isinstance(v, int | float) and v > 0 for v in result["ratios"].values())
        machine = result["machine"]
        assert machine["cores"] >= 1 and machine["kernel"] and machine["python"]
        assert machine["packages"]["aiohttp"] and machine["date"]
        assert (tmp_path / "plots" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    md = (tmp_path / "RESULTS.md").read_text()
    for name in OURS:
        assert f'<a id="{name}"></a>' in md
        assert f"python -m bench {name} --quick" in md
    assert "MB/s" in md and "samples/s" in md

    # Text written outside the generated block survives a re-render.
    (tmp_path / "RESULTS.md").write_text(md + "\nA hand-written before/after table.\n")
    subprocess.run([sys.executable, "-m", "bench", "--render-only", "--out", str(tmp_path)],
                   cwd=REPO, check=True, capture_output=True, timeout=120)
    again = (tmp_path / "RESULTS.md").read_text()
    assert again.count("A hand-written before/after table.") == 1
    assert again.count('<a id="loopback"></a>') == 1


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
