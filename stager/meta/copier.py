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

from ..checksum import crc32c
from ..dataplane import DataPlane
from ..dataplane.writer import routes_around
from ..errors import ChunkNotFound, CorruptChunk, InsufficientStorage, StagerError
from ..protocol.models import TargetInfo
from ..ratelimit import TokenBucket
from .service import GONE_STATES

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
            found, expected = await self._read_good(chunk, crc, sources, memoryview(buf))
            if found is not Outcome.COPIED:
                return found
            target = self._target(dest)
            if target is None or not target.up:
                return Outcome.DEFERRED
            try:
                await self._plane().put_chunk(dest, target.url, chunk, buf, expected)
            except (StagerError, OSError) as exc:
                log.info("copy of %s to %s deferred: %s", chunk, dest, exc)
                if routes_around(exc) and not isinstance(exc, InsufficientStorage):
                    self._suspect(dest, str(exc))
                return Outcome.DEFERRED
            self.copied_bytes += length
            self.copied_chunks += 1
            return Outcome.COPIED

    async def _read_good(self, chunk: str, crc: int | None, sources: Sequence[str],
                         out: memoryview) -> tuple[Outcome, int]:
        """Fill ``out`` from the first source with good bytes: (COPIED, crc), else why not."""
        unreachable = False
        for source in sources:
            target = self._target(source)
            if target is not None and target.state in GONE_STATES:
                if not self._draining(target):
                    continue            # gone for good: nothing to wait for
            elif target is None or not target.up:
                unreachable = True
                continue
            try:
                stored = await self._plane().read_chunk_into(source, target.url, chunk, 0, out,
                                                             whole=True, patient=True)
            except (ChunkNotFound, CorruptChunk):
                continue
            except (StagerError, OSError) as exc:
                log.info("reading %s from %s failed: %s", chunk, source, exc)
                unreachable = True
                continue
            expected = crc if crc is not None else stored
            if expected is not None and crc32c(out) == expected:
                return Outcome.COPIED, expected
            log.warning("chunk %s on %s does not match its checksum", chunk, source)
        return (Outcome.DEFERRED if unreachable else Outcome.UNRECOVERABLE), 0
