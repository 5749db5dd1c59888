"""What heartbeats say beyond liveness: throughput and scrub progress
(stager/meta/targetstats.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import raw_http
from reliability_util import wait_for

from stager import Client
from stager.meta.targetstats import TargetRates
from stager.protocol.models import LayoutSpec
from stager.testing import ThreadCluster


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


def test_a_running_scrub_shows_its_bytes_remaining(tmp_path: Path) -> None:
    """A data server's background scrub pass, slowed down, is seen running with bytes
    remaining in ``status`` (the dashboard's scrub panel) and on ``/metrics``; then done."""
    cluster = ThreadCluster(tmp_path, 2, scrub_interval=0.5, scrub_rate=512 * 1024)
    cluster.start()
    try:
        cluster.wait_targets(2)
        with Client(cluster.meta_url) as client:
            client.pipe("/s/f.bin", b"s" * (4 << 20),
                        layout=LayoutSpec(chunk_size=1 << 20, stripe_count=2))

        def status() -> dict[str, Any]:
            return dict(json.loads(raw_http(cluster.meta_url, "GET", "/v1/status").body))

        def running() -> dict[str, Any] | None:
            return next((p for p in status()["scrubs"].values()
                         if p["state"] == "running" and 0 < p["bytes_remaining"]
                         < p["bytes_total"]), None)

        seen = wait_for(running, 20, "a scrub pass under way, part done")
        assert seen["chunks_total"] >= 2 and seen["bytes_done"] > 0
        metrics = raw_http(cluster.meta_url, "GET", "/metrics").body.decode()
        assert "stager_target_scrub_bytes_remaining{" in metrics
        done = wait_for(lambda: all(p["passes"] >= 1 and p["bytes_total"] >= 2 << 20
                                    for p in status()["scrubs"].values()) or None,
                        30, "a full pass of each target")
        assert done
    finally:
        cluster.stop()

