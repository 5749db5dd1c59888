"""refresh_health scans the targets only once one of them may have gone stale
(stager/meta/targettable.py), and still marks every stale one down in time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from reliability_util import Clock, clocked_service

from stager.meta.service import MetaService


class CountingTable:
    """Counts the scans: each one ends by telling the table (``scanned``)."""

    def __init__(self, svc: MetaService) -> None:
        self.scans = 0
        table = svc.targets
        original = table.scanned

        def scanned() -> None:
            self.scans += 1
            original()

        table.scanned = scanned     # type: ignore[method-assign]


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[tuple[MetaService, Clock]]:
    async with clocked_service(tmp_path, 3, lambda i: f"http://127.0.0.1:{i + 1}",
                               boot=True) as got:
        yield got


def states(svc: MetaService) -> dict[str, str]:
    return {t.id: t.state for t in svc.list_targets()}


async def beat(svc: MetaService, *ids: str) -> None:
    await svc.heartbeats([(t, 1 << 30, 0, 0) for t in ids])


async def test_fresh_targets_are_scanned_once_a_timeout_and_a_stale_one_still_goes_down(
        service: tuple[MetaService, Clock]) -> None:
    """A scan makes the oldest heartbeat exact; heartbeats only make targets fresher,
    so the next scan comes when that oldest one could be stale: at most one scan per
    ``target_timeout`` (10 s) while all beat, where every look scanned before."""
    svc, clock = service
    states(svc)
    counted = CountingTable(svc)
    for _ in range(20):                          # a look a second, beats every 2 s
        clock.now += 1
        if clock.now % 2 == 0:
            await beat(svc, "t0", "t1", "t2")
        assert states(svc) == {"t0": "up", "t1": "up", "t2": "up"}
    assert 1 <= counted.scans <= 2, counted.scans
    await beat(svc, "t0", "t1")                  # t2 falls silent
    clock.now += 11
    await beat(svc, "t0", "t1")
    assert states(svc) == {"t0": "up", "t1": "up", "t2": "down"}


async def test_a_target_set_with_an_old_heartbeat_is_seen(
        service: tuple[MetaService, Clock]) -> None:
    """Any assignment counts, not only heartbeats: a target loaded from the shared
    state with an old heartbeat goes down at the next look."""
    svc, clock = service
    states(svc)
    svc.targets["t1"] = replace(svc.targets["t1"], last_heartbeat=clock.now - 60)
    assert states(svc)["t1"] == "down"


async def test_a_suspect_is_looked_at_until_its_time_is_up(
        service: tuple[MetaService, Clock]) -> None:
    svc, clock = service
    svc.suspect("t0", "test")
    assert states(svc)["t0"] == "suspect"
    for _ in range(4):                           # t0 keeps heartbeating meanwhile
        clock.now += 3
        await beat(svc, "t0", "t1", "t2")
    assert states(svc)["t0"] == "up"             # suspicion over after target_timeout
