"""Live telemetry keeps one object per loader and per target sample, not one per message:
what outlives the garbage collector's young generations at thousands of reports and
beats a second makes its collections hold the metadata server's event loop (bench scale).
The jobs table (stager/meta/jobtable.py) and the per-target rates
(stager/meta/targetstats.py) are tested here without HTTP, on a hand-driven clock."""

from __future__ import annotations

from stager.meta.jobtable import JobTable
from stager.meta.targetstats import STEPS, TargetRates
from stager.protocol.jobreport import MIN_TTL, ttl


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_loader_reporting_for_an_hour_keeps_one_due_item() -> None:
    clock = Clock()
    table = JobTable(clock)
    for _ in range(720):                        # every 5 s for an hour
        table.report("j", 0, None, {"interval": 5.0})
        clock.now += 5.0
    assert len(table.live()) == 1
    assert len(table._due) == 1                 # noqa: SLF001 - the heap's size is the point


def test_an_entry_lives_on_while_reported_and_expires_after_missed_reports() -> None:
    clock = Clock()
    table = JobTable(clock)
    life = ttl(5.0)
    table.report("j", 0, None, {"interval": 5.0})
    clock.now += life - 1
    table.report("j", 0, None, {"interval": 5.0})  # moves the expiry on
    clock.now += life - 1                       # past the first report's expiry
    assert [e.rank for e in table.live()] == [0]
    clock.now += 2                              # past the second's
    assert table.live() == [] and not table.knows("j")


def test_a_shorter_interval_expires_the_entry_sooner() -> None:
    clock = Clock()
    table = JobTable(clock)
    table.report("j", 0, None, {"interval": 600.0})
    table.report("j", 0, None, {"interval": 1.0})
    clock.now += max(MIN_TTL, ttl(1.0)) + 1
    assert table.live() == []


def test_a_target_keeps_a_bounded_number_of_samples_and_the_rate_over_the_window() -> None:
    clock = Clock()
    rates = TargetRates(clock, window=60.0)
    for i in range(1800):                       # a beat every 2 s for an hour, 1 MB/s read
        rates.observe("t0", i * 2_000_000, 0)
        clock.now += 2.0
        assert len(rates._samples["t0"]) <= STEPS + 2   # noqa: SLF001 - the point
    r, w = rates.rates("t0") or (0.0, 0.0)
    assert r == 1e6 and w == 0.0
