"""Copy one chunk from a good replica to a target: the step rebuild and repair share.

The bytes go through the metadata server's data plane (GET from a source,
CRC32C checked against the checksum committed with the file, PUT to the
destination, durable there before the PUT answers, and counted only when the
answer proves it: :mod:`stager.dataplane.ack`), paced by one token bucket
(``rebuild_rate`` bytes/s) and at most ``rebuild_concurrency`` copies at once.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Sequence

from ...dataplane import DataPlane
from ...dataplane.goodcopy import read_good_copy
from ...dataplane.writeengine import only_full, routes_around
from ...errors import StagerError, Unavailable
from ...protocol.models import TargetInfo
from ...ratelimit import TokenBucket
from ..service import GONE_STATES

log = logging.getLogger("stager.meta")


class Outcome(enum.Enum):
    COPIED = "copied"
    UNRECOVERABLE = "unrecoverable"   # every source answered: missing or corrupt
    DEFERRED = "deferred"             # a source or the destination could not be reached


class ChunkCopier:
    """``draining(target)`` says whether a removed or lost target still answers, so
    that its copies may serve as a last source (``stager target remove`` of a
    running server drains it; a dead one is skipped, not waited for).
    ``suspect(target, reason)`` is told of a destination whose write failed as a
    writer routes around (unreachable, 5xx, an ack that proves nothing), as a
    writer's report would: the next pass places the copy elsewhere."""

    def __init__(self, plane: Callable[[], DataPlane],
                 target: Callable[[str], TargetInfo | None], *, rate: int,
                 concurrency: int, draining: Callable[[TargetInfo], bool] = lambda t: False,
                 suspect: Callable[[str, str], None] = lambda target, reason: None
                 ) -> None:
        self._plane = plane
        self._target = target
        self._draining = draining
        self._suspect = suspect
        self.bucket = TokenBucket(rate)
        self.limit = asyncio.Semaphore(max(1, concurrency))
        self.copied_bytes = 0
        self.copied_chunks = 0

    async def copy(self, chunk: str, length: int, crc: int | None, sources: Sequence[str],
                   dest: str) -> Outcome:
        """Put a verified copy of ``chunk`` (``length`` bytes) on ``dest``."""
        async with self.limit:
            await self.bucket.take(length)
            buf = bytearray(length)
            readable, skipped = self._readable(sources)
            try:
                expected = await read_good_copy(self._plane(), chunk, readable,
                                                memoryview(buf), crc)
            except Unavailable as exc:
                log.info("no copy of %s to read: %s", chunk, exc)
                return Outcome.UNRECOVERABLE if exc.details["answered"] and not skipped \
                    else Outcome.DEFERRED
            target = self._target(dest)
            if target is None or not target.up:
                return Outcome.DEFERRED
            try:
                await self._plane().put_chunk(dest, target.url, chunk, buf, expected)
            except (StagerError, OSError) as exc:
                log.info("copy of %s to %s deferred: %s", chunk, dest, exc)
                if routes_around(exc) and not only_full(exc):
                    self._suspect(dest, str(exc))
                return Outcome.DEFERRED
            self.copied_bytes += length
            self.copied_chunks += 1
            return Outcome.COPIED

    def _readable(self, sources: Sequence[str]) -> tuple[list[tuple[str, str]], bool]:
        """The sources to read from, with their URLs, and whether one that is down
        now (not gone for good) was left out: a later pass may find it up."""
        readable, skipped = [], False
        for source in sources:
            target = self._target(source)
            if target is not None and target.state in GONE_STATES:
                if self._draining(target):
                    readable.append((source, target.url))
            elif target is None or not target.up:
                skipped = True
            else:
                readable.append((source, target.url))
        return readable, skipped
