"""The simulated training loop the Loader benchmarks drive: take a batch, then
"compute" for a fixed time (``time.sleep``: the GIL is free, as while a GPU step
runs), and count the time spent waiting for the next batch."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

from .common import machine_busy


def drive(make: Callable[[], Iterable[Any]], count: Callable[[Any], int], step: float,
          max_batches: int) -> dict[str, float]:
    """Consume up to ``max_batches`` with ``step`` seconds of 'compute' after each."""
    start = time.perf_counter()
    it = iter(make())
    first = stall = late = 0.0
    busy = float("nan")
    samples = batches = 0
    while batches < max_batches:
        t = time.perf_counter()
        batch = next(it, None)
        waited = time.perf_counter() - t
        if batch is None:
            break
        if batches == 0:
            first = time.perf_counter()
            busy = machine_busy()
        else:
            stall += waited
            samples += count(batch)
        batches += 1
        del batch
        if step:
            t = time.perf_counter()
            time.sleep(step)
            late += time.perf_counter() - t - step
    end = time.perf_counter()
    busy = machine_busy() - busy
    close_iterator(it)
    active = end - first if batches > 1 else float("nan")
    return {"ttfb": first - start, "rate": samples / active, "stall": stall / active,
            "batches": batches, "cpu": busy / samples if samples else float("nan"),
            "late": late / batches if batches else float("nan")}


def close_iterator(it: Any) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def sleep_late(step: float, times: int) -> float:
    """How late ``time.sleep(step)`` returns, the median of ``times`` sleeps."""
    late = []
    for _ in range(times):
        t = time.perf_counter()
        time.sleep(step)
        late.append(time.perf_counter() - t - step)
    return statistics.median(late)

