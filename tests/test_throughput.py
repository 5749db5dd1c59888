"""Per-target throughput from heartbeat counters (stager/meta/throughput.py)."""

from __future__ import annotations

import pytest

from stager.meta.throughput import TargetRates


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rate_over_the_window_from_successive_heartbeats() -> None:
    clock = Clock()
    rates = TargetRates(clock, window=60.0)
    assert rates.rates("t0") is None
    rates.observe("t0", 0, 0)
    assert rates.rates("t0") is None            # one sample: no rate yet
    for i in range(1, 61):                      # 10 MB/s read, 1 MB/s written, for 60 s
        clock.now += 1.0
        rates.observe("t0", i * 10_000_000, i * 1_000_000)
    r, w = rates.rates("t0") or (0.0, 0.0)
    assert r == pytest.approx(10e6) and w == pytest.approx(1e6)
    assert rates.status()["throughput"]["t0"]["read_bytes_per_second"] == pytest.approx(10e6)


def test_old_samples_leave_the_window() -> None:
    clock = Clock()
    rates = TargetRates(clock, window=10.0)
    rates.observe("t0", 0, 0)
    clock.now += 100.0
    rates.observe("t0", 1_000_000, 0)           # a burst long ago...
    for _ in range(20):                         # ...then 20 s of idle heartbeats
        clock.now += 1.0
        rates.observe("t0", 1_000_000, 0)
    assert rates.rates("t0") == (0.0, 0.0)


def test_a_restarted_data_server_starts_afresh_and_a_silent_one_has_no_rate() -> None:
    clock = Clock()
    rates = TargetRates(clock, window=60.0)
    rates.observe("t0", 5_000_000, 5_000_000)
    clock.now += 1.0
    rates.observe("t0", 6_000_000, 5_000_000)
    clock.now += 1.0
    rates.observe("t0", 100, 0)                 # counters went back: a restart
    assert rates.rates("t0") is None
    clock.now += 1.0
    rates.observe("t0", 300, 0)
    assert rates.rates("t0") == (200.0, 0.0)
    clock.now += 61.0                           # no heartbeat for a minute
    assert rates.rates("t0") is None and rates.status() == {"throughput": {}}
