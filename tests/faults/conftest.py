"""The fault-injection suite: every scenario records its figures, printed at the end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A dict the scenario fills with what it measured; shown in the run's summary
    (tests/conftest.py).  It travels in the test's report (``user_properties``), so
    that under pytest-xdist the controller, which prints the summary, has the workers'
    figures too."""
    measured: dict[str, Any] = {}
    request.node.user_properties.append(("figures", measured))
    yield measured
    if measured:
        print(f"\n{request.node.name}: {measured}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--long`` soaks run past the suite's 300 s timeout: give them their length."""
    if not config.getoption("--long"):
        return
    from faults.test_history import run_seconds

    for item in items:
        if item.name.startswith("test_history_under"):
            item.add_marker(pytest.mark.timeout(run_seconds(config) + 300))
