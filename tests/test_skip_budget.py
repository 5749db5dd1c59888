"""``--strict-skips`` (tests/skip_budget.py): a skip outside the expected list fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from skip_budget import SkipBudget

REPO = Path(__file__).resolve().parent.parent


def skipped(nodeid: str, reason: str) -> pytest.TestReport:
    return pytest.TestReport(nodeid, ("x.py", 1, "t"), {}, "skipped",
                             ("x.py", 1, f"Skipped: {reason}"), "setup")


def test_expected_skips_pass_and_others_are_kept_with_their_reason() -> None:
    budget = SkipBudget()
    budget.pytest_runtest_logreport(skipped("tests/test_torch_gpu.py::test_feed", "needs CUDA"))
    budget.pytest_runtest_logreport(skipped(
        "tests/test_parquet_zarr.py::TestStagerStore::test_get_sync",
        "store does not implement SupportsGetSync"))
    assert budget.unexpected == []
    budget.pytest_runtest_logreport(skipped("tests/test_fs.py::test_x[postgresql]",
                                            "no PostgreSQL here: initdb not found"))
    # the right test with another reason is not excused either
    budget.pytest_runtest_logreport(skipped("tests/test_torch_gpu.py::test_feed", "no torch"))
    assert budget.unexpected == [
        ("tests/test_fs.py::test_x[postgresql]", "no PostgreSQL here: initdb not found"),
        ("tests/test_torch_gpu.py::test_feed", "no torch")]


@pytest.mark.slow                   # pytest in a subprocess
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_an_unexpected_skip_fails_the_run(workers: list[str]) -> None:
    """The four kubectl comparisons skip without kubectl: not in the list, so the run
    fails and names them; the rest of the module alone passes.  Under xdist too."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers,
            "--strict-skips", "tests/test_deploy_k8s.py"]
    env = {**os.environ, "STAGER_TEST_NO_KUBECTL": "1"}
    failed = subprocess.run([*argv, "-k", "kubectl"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=240)
    assert failed.returncode == 1, failed.stdout[-2000:]
    assert "unexpected skips" in failed.stdout
    assert failed.stdout.count("test_our_rendering_is_kubectls") == 4
    passed = subprocess.run([*argv, "-k", "not kubectl"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=240)
    assert passed.returncode == 0, passed.stdout[-2000:]
    assert "unexpected skips" not in passed.stdout
