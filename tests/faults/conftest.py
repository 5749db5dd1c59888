"""The fault-injection suite: every scenario records its figures, printed at the end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

FIGURES: list[tuple[str, dict[str, Any]]] = []


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A dict the scenario fills with what it measured; shown in the run's summary."""
    measured: dict[str, Any] = {}
    yield measured
    if measured:
        FIGURES.append((request.node.name, measured))
        print(f"\n{request.node.name}: {measured}")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    terminalreporter.section("fault-injection figures")
    for name, measured in FIGURES:
        terminalreporter.write_line(name)
        for key, value in measured.items():
            terminalreporter.write_line(f"    {key}: {value}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--long`` soaks run past the suite's 300 s timeout: give them their length."""
    if not config.getoption("--long"):
        return
    from faults.test_history import run_seconds

    for item in items:
        if item.name.startswith("test_history_under"):
            item.add_marker(pytest.mark.timeout(run_seconds(config) + 300))
