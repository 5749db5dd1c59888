"""What heartbeats say of a target beyond its liveness: throughput and scrub progress.

A data server's heartbeat carries two counters, chunk bytes served and stored since
it started, and its background scrub's progress
(:class:`~stager.protocol.messages.Heartbeat`).  :class:`TargetRates` keeps a
minute of the counters per target and answers the rate between the oldest and the
newest: what the dashboard's targets table shows (the ``throughput`` section of
``status``) and the ``stager_target_*_bytes_per_second`` gauges.  A counter that
went backwards is a restarted data server: its older samples are dropped.  The last
scrub progress of each target is the ``scrubs`` section.

Only the metadata server a data server heartbeats to sees these; the others of a
shared store show no rate for it (Prometheus' ``rate(stager_sent_bytes_total[1m])``
on the data servers themselves is the cluster-wide view).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from aiohttp import web

from ..protocol.messages import Heartbeat, ScrubProgress
from .service import MetaService

WINDOW = 60.0       # seconds of samples kept per target
STEPS = 12          # samples kept over a window at most (besides the newest)


class TargetRates:
    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 window: float = WINDOW) -> None:
        self.clock = clock
        self.window = window
        self._samples: dict[str, deque[tuple[float, int, int]]] = {}
        self.scrubs: dict[str, ScrubProgress] = {}

    def observe(self, target_id: str, bytes_read: int, bytes_written: int) -> None:
        """A heartbeat's counters.  The newest sample replaces the one before it while
        that one is less than ``window / STEPS`` newer than its predecessor: a rate
        reads only the oldest and the newest, and a sample kept for a minute per beat
        (thousands a second at a site) is an object each beat that outlives the
        garbage collector's young generations, whose collections then held the event
        loop several times a second (bench scale)."""
        now = self.clock()
        samples = self._samples.setdefault(target_id, deque())
        if samples and (bytes_read < samples[-1][1] or bytes_written < samples[-1][2]):
            samples.clear()         # the data server restarted: its counters began again
        sample = (now, bytes_read, bytes_written)
        if len(samples) > 1 and samples[-1][0] - samples[-2][0] < self.window / STEPS:
            samples[-1] = sample
        else:
            samples.append(sample)
        while len(samples) > 2 and now - samples[1][0] >= self.window:
            samples.popleft()       # keep one sample at or past the window's start

    def rates(self, target_id: str) -> tuple[float, float] | None:
        """(read, write) bytes a second over the last minute; ``None`` before two
        heartbeats, or when the target's last one is older than the window."""
        samples = self._samples.get(target_id)
        if not samples or len(samples) < 2 or self.clock() - samples[-1][0] > self.window:
            return None
        (t0, r0, w0), (t1, r1, w1) = samples[0], samples[-1]
        span = t1 - t0
        return ((r1 - r0) / span, (w1 - w0) / span) if span > 0 else None

    def status(self) -> dict[str, Any]:
        """The ``throughput`` section of ``status``: target id → read and write bytes a
        second (only targets with a rate)."""
        out = {}
        for target_id in sorted(self._samples):
            rate = self.rates(target_id)
            if rate is not None:
                out[target_id] = {"read_bytes_per_second": round(rate[0], 1),
                                  "write_bytes_per_second": round(rate[1], 1),
                                  "window_seconds": self.window}
        return {"throughput": out}


    def scrub_status(self) -> dict[str, Any]:
        """The ``scrubs`` section of ``status``: target id → its scrub's progress."""
        return {"scrubs": {t: p.to_json() for t, p in sorted(self.scrubs.items())}}


RATES = web.AppKey("rates", TargetRates)
# The service heartbeats go to, for the batched route (stager/meta/http/heartbeats.py),
# which stager/meta/http/app.py imports: it cannot import that module's keys back.
BEATEN = web.AppKey("beaten", MetaService)


def install(app: web.Application, service: MetaService) -> TargetRates:
    """Give the metadata application the per-target rates and scrub progress: the
    ``throughput`` and ``scrubs`` sections of ``status``; the heartbeat handler feeds
    them (:func:`observe`)."""
    rates = TargetRates()
    app[RATES] = rates
    app[BEATEN] = service
    service.status_extras.append(rates.status)
    service.status_extras.append(rates.scrub_status)
    return rates


def observe(request: web.Request, target_id: str, beat: Heartbeat) -> None:
    rates = request.app[RATES]
    rates.observe(target_id, beat.bytes_read, beat.bytes_written)
    if beat.scrub is not None:
        rates.scrubs[target_id] = beat.scrub
