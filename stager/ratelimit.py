"""A token bucket for background byte streams (rebuild copies, scrub reads)."""

from __future__ import annotations

import asyncio
import time


class TokenBucket:
    """``await take(n)`` paces callers to ``rate`` bytes per second on average.

    Up to ``burst`` bytes (default: one second's worth) pass without waiting;
    one request larger than the burst is let through and paid for afterwards,
    so a single big chunk never deadlocks the bucket.  ``rate`` 0 means no limit.
    """

    def __init__(self, rate: int, burst: int | None = None) -> None:
        self.rate = max(0, int(rate))
        self.burst = float(burst if burst is not None else self.rate)
        self._tokens = self.burst
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()

    async def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        async with self._lock:          # first come, first served
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= n
            if self._tokens < 0:
                await asyncio.sleep(-self._tokens / self.rate)
