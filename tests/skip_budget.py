"""``--strict-skips`` (``make test``): a run fails on any skip not listed in :data:`EXPECTED`.

A test that skips because a tool is missing (PostgreSQL, FUSE, Slurm, network
namespaces, kubectl) says why, but in a green run nobody reads why: whole parts of
the suite could stop running on another machine unseen.  The plugin collects every
skip the run reports (under pytest-xdist the controller receives the workers'
reports, so it works there too), prints those outside the list under "unexpected
skips", and turns the run's exit status into a failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Expected:
    """Skips allowed on a machine ``make test`` supports, and why they are."""

    nodeid: str      # a regular expression the test's id must match (from its start)
    reason: str      # ... and one the skip's reason must contain
    why: str


EXPECTED = (
    Expected(r"tests/test_torch_gpu\.py::", r"CUDA",
             "the GPU tests need CUDA; CI machines have no GPU"),
    Expected(r"tests/test_parquet_zarr\.py::.*_sync", r"does not implement Supports\w*Sync",
             "zarr's own StoreTests skip their *_sync cases for an async store"),
    Expected(r"tests/test_deploy_image\.py::test_entry_commands_in_a_clean_venv",
             r"the image itself was built",
             "the Docker image test's stand-in, where the image itself passed"),
)


class SkipBudget:
    """Collects skips (``pytest_runtest_logreport``) and judges them at the end."""

    def __init__(self, expected: tuple[Expected, ...] = EXPECTED) -> None:
        self.expected = expected
        self.unexpected: list[tuple[str, str]] = []

    @staticmethod
    def reason(report: pytest.TestReport) -> str:
        longrepr = report.longrepr
        if isinstance(longrepr, tuple) and len(longrepr) == 3:
            return str(longrepr[2]).removeprefix("Skipped: ")
        return str(longrepr)

    def allowed(self, nodeid: str, reason: str) -> bool:
        return any(re.match(e.nodeid, nodeid) and re.search(e.reason, reason)
                   for e in self.expected)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        reason = self.reason(report)
        if not self.allowed(report.nodeid, reason):
            self.unexpected.append((report.nodeid, reason))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.unexpected and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.unexpected:
            return
        terminalreporter.section("unexpected skips (--strict-skips)", red=True)
        for nodeid, reason in self.unexpected:
            terminalreporter.write_line(f"{nodeid}: {reason}")
        terminalreporter.write_line(
            f"{len(self.unexpected)} skipped test(s) outside tests/skip_budget.py's EXPECTED: "
            "install what they need (`make sysdeps` as root) or list them there with why")
