"""``make test`` runs modules in parallel with ``--dist loadgroup``: the tests of one
``xdist_group`` must all run on one worker, one after another.

Everything that cannot run twice at once counts on it: a module-scoped cluster starts
once per module, and the modules that start a Slurm, per-job clusters or namespaces
share the group ``slurm`` (their jobs' ids and node names would collide).  pytest 9
with pytest-xdist 3.8 silently broke it (each test became its own group), so a run of
two grouped modules under two workers checks it here, with the installed pytest and
pytest-xdist.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MODULE = """
import os, time
import pytest
pytestmark = pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(3))
def test_{name}(i):
    time.sleep(0.2)      # long enough that an idle worker would take one if it could
"""


@pytest.mark.slow                   # pytest in a subprocess
def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / f"test_group_{name}.py").write_text(MODULE.format(name=name))
    (tmp_path / "test_alone.py").write_text("def test_alone():\n    pass\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    workers = {m[2]: m[1] for m in re.finditer(r"\[(gw\d+)\].*PASSED \S*::(test_\w+\[\d\])",
                                               done.stdout)}
    grouped = [k for k in workers if k.startswith(("test_a[", "test_b["))]
    assert len(grouped) == 6, done.stdout[-2000:]
    assert len({workers[k] for k in grouped}) == 1, workers
