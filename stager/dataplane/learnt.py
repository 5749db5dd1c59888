"""What a client remembers of cached files' chunks: their CRC32Cs, and its reads of them.

A read of a chunk of a cached (attached) file needs the chunk filled and its CRC32C,
which the metadata server answers (route ``fill``).  Asked before every read, that
round trip and its touch of each chunk cost the metadata server more than the read
costs the data servers, so a client keeps the CRC32Cs it learnt, by file id and chunk
index, and reads those chunks straight from the data servers.  A file changed at its
source is committed anew with a new file id at its next refresh, so a CRC32C learnt
under one id is of one version for good: the read engine checks every whole chunk
against it, and a chunk evicted since (a data server answers 404) is asked for again
(:mod:`.engine`).

Eviction still learns of these reads: each is queued here and reported after the
fact, in bulk, every :data:`REPORT_EVERY` seconds (route ``cache_reads``), off the
read's path; the metadata server counts them as hits and marks the chunks used.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from ..errors import StagerError
from ..protocol.batch import MAX_BATCH_ITEMS
from ..protocol.cache import FillItem
from ..protocol.models import parse_chunk_id

log = logging.getLogger(__name__)
REPORT_EVERY = 0.2          # seconds between reports of reads (at most)
MAX_CHUNKS = 1 << 18        # CRC32Cs kept (about 110 bytes each, more for one-chunk files);
                            # past this the earliest learnt files are forgotten
CLOSE_TIMEOUT = 2.0         # close() waits at most this long for the last report

Report = Callable[[Sequence[FillItem]], Awaitable[object]]


class CrcMemory:
    """Learnt CRC32Cs of cached chunks, by file id then chunk index, and the reads of
    them not yet reported (``report``: sends one batch of reads)."""

    def __init__(self, report: Report | None = None, *, limit: int = MAX_CHUNKS,
                 every: float = REPORT_EVERY) -> None:
        self.report = report
        self.limit = limit
        self.every = every
        self._crc: dict[str, dict[int, int]] = {}
        self._count = 0
        self._reads: dict[str, list[int]] = {}
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return self._count

    def crc(self, chunk: str) -> int | None:
        """The CRC32C learnt for chunk ``chunk`` (``FILEID.INDEX``), or None."""
        file_id, index = parse_chunk_id(chunk)
        known = self._crc.get(file_id)
        return None if known is None else known.get(index)

    def learn(self, chunks: Sequence[str], crcs: Sequence[int]) -> None:
        for chunk, crc in zip(chunks, crcs, strict=True):
            file_id, index = parse_chunk_id(chunk)
            known = self._crc.setdefault(file_id, {})
            if index not in known:
                self._count += 1
            known[index] = crc
        while self._count > self.limit and len(self._crc) > 1:
            oldest = next(iter(self._crc))          # dicts keep insertion order
            self._count -= len(self._crc.pop(oldest))

    def forget(self, chunks: Sequence[str]) -> None:
        """Drop what was learnt of ``chunks`` (a data server had none of them)."""
        for chunk in chunks:
            file_id, index = parse_chunk_id(chunk)
            known = self._crc.get(file_id)
            if known is not None and known.pop(index, None) is not None:
                self._count -= 1

    def read(self, chunks: Sequence[str]) -> None:
        """Chunks ``chunks`` were read with learnt CRC32Cs: report them soon."""
        if self.report is None or not chunks:
            return
        for chunk in chunks:
            file_id, index = parse_chunk_id(chunk)
            self._reads.setdefault(file_id, []).append(index)
        loop = asyncio.get_running_loop()
        # a task of another loop: this process was forked (a DataLoader worker)
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._reporter())

    async def _reporter(self) -> None:
        while self._reads:
            await asyncio.sleep(self.every)
            await self.flush()

    async def flush(self) -> None:
        """Send the reads queued so far (a refusal or an unreachable server costs a log
        line: the reads happened, only their count and recency are lost)."""
        reads, self._reads = self._reads, {}
        if not reads or self.report is None:
            return
        items = [FillItem(f, tuple(c)) for f, c in reads.items()]
        for start in range(0, len(items), MAX_BATCH_ITEMS):
            try:
                await self.report(items[start:start + MAX_BATCH_ITEMS])
            except StagerError as exc:
                log.info("reads of cached chunks not reported: %s", exc)

    async def close(self) -> None:
        """Report what is queued (for at most :data:`CLOSE_TIMEOUT` seconds) and stop."""
        task, self._task = self._task, None
        if task is not None and task.get_loop() is asyncio.get_running_loop():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), CLOSE_TIMEOUT)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(asyncio.TimeoutError, StagerError):
            await asyncio.wait_for(self.flush(), CLOSE_TIMEOUT)
