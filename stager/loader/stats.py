"""Loader telemetry: what was read, how long the consumer waited, where time went.

*Stall* is time the consumer spent blocked in ``__next__`` waiting for a batch
that was not ready.  The wait for the very first batch is reported apart, as
*time to first batch*; ``stall_fraction`` is the stall after the first batch
over the time since the first batch, i.e. the share of the training loop's
time it spent waiting for data in steady state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..dataplane import TargetCounters


@dataclass
class Counters:
    """Updated from the I/O loop, the pool and the consumer; read by ``stats()``."""

    samples: int = 0
    batches: int = 0
    bytes: int = 0
    fetches: int = 0
    fetch_seconds: float = 0.0
    decode_seconds: float = 0.0
    stall_seconds: float = 0.0          # after the first batch
    first_batch_seconds: float | None = None
    started: float | None = None        # perf_counter of the first __iter__
    first_batch_at: float | None = None
    last_batch_at: float | None = None
    peak_held_bytes: int = 0
    waiting_since: float | None = None  # the consumer is blocked in __next__ since then

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def add_fetch(self, seconds: float, nbytes: int) -> None:
        with self._lock:
            self.fetches += 1
            self.fetch_seconds += seconds
            self.bytes += nbytes

    def add_decode(self, seconds: float) -> None:
        with self._lock:
            self.decode_seconds += seconds

    def note_held(self, held: int) -> None:
        if held > self.peak_held_bytes:
            self.peak_held_bytes = held

    def iteration_started(self) -> None:
        if self.started is None:
            self.started = time.perf_counter()

    def batch_taken(self, waited: float, samples: int) -> None:
        now = time.perf_counter()
        with self._lock:
            if self.first_batch_at is None:
                self.first_batch_at = now
                self.first_batch_seconds = now - (self.started or now)
            else:
                self.stall_seconds += waited
            self.last_batch_at = now
            self.batches += 1
            self.samples += samples

    def snapshot(self, targets: Mapping[str, TargetCounters],
                 base: Mapping[str, TargetCounters]) -> dict[str, Any]:
        with self._lock:
            active = ((self.last_batch_at or 0.0) - self.first_batch_at
                      if self.first_batch_at is not None else 0.0)
            waiting = self.waiting_since
            return {
                "samples": self.samples,
                "batches": self.batches,
                "bytes": self.bytes,
                "fetches": self.fetches,
                "stall_seconds": self.stall_seconds,
                "stall_fraction": self.stall_seconds / active if active > 0 else 0.0,
                "fetch_seconds": self.fetch_seconds,
                "decode_seconds": self.decode_seconds,
                "time_to_first_batch": self.first_batch_seconds,
                "samples_per_second": (self.samples / (self.last_batch_at - self.started)
                                       if self.started and self.last_batch_at
                                       and self.last_batch_at > self.started else 0.0),
                "peak_prefetch_bytes": self.peak_held_bytes,
                # a wait still in progress (not yet in stall_seconds): a loader stuck on
                # a dead target shows here, not only once the batch finally comes
                "waiting_seconds": time.perf_counter() - waiting if waiting else 0.0,
                "targets": target_deltas(targets, base),
            }


def target_deltas(now: Mapping[str, TargetCounters],
                  base: Mapping[str, TargetCounters]) -> dict[str, dict[str, Any]]:
    """Per target: what this loader added to the client's counters (bytes, latency)."""
    out: dict[str, dict[str, Any]] = {}
    for target, c in list(now.items()):
        b = base.get(target, TargetCounters())
        requests = c.requests - b.requests
        if requests <= 0:
            continue
        seconds = c.seconds - b.seconds
        out[target] = {"requests": requests, "errors": c.errors - b.errors,
                       "bytes": c.bytes_read - b.bytes_read, "seconds": seconds,
                       "mean_latency": seconds / requests}
    return out


def copy_counters(counters: Mapping[str, TargetCounters]) -> dict[str, TargetCounters]:
    return {t: TargetCounters(c.requests, c.errors, c.bytes_read, c.bytes_written, c.seconds,
                              c.failed_at) for t, c in list(counters.items())}
