"""The read side of an open file: whole chunks, fetched ahead of a sequential reader.

The kernel sends reads of up to 1 MiB, several at once and slightly out of
order (its own readahead).  Answering each with its own ranged request would
cost one round trip per MiB; instead a sequential reader is served from whole
chunks that :class:`~stager.dataplane.StripedReader` fetches (verified against
their committed CRC32C, with replica failover), and the next
``readahead`` chunks are already in flight on their targets, so every
stripe target works at once.  A read that does not follow the previous one is
served by a ranged read of exactly its bytes and starts no readahead.

One :class:`ChunkCache` per open inode, shared by its file handles.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..dataplane import StripedReader
from ..errors import Unavailable
from ..layout import chunk_length

Refresh = Callable[[], Awaitable[StripedReader]]
SPARE = 4                # chunk buffers kept for reuse


@dataclass(eq=False)
class _Slot:
    task: asyncio.Task[bytearray]
    pins: int = 0            # readers between asking for the chunk and answering with it


class ChunkCache:
    def __init__(self, reader: StripedReader, *, readahead: int, refresh: Refresh,
                 stats: Counter[str] | None = None) -> None:
        self.reader = reader
        self.size = reader.size
        self.chunk_size = reader.layout.chunk_size
        self.readahead = max(0, readahead)
        self.capacity = 2 * self.readahead + 2
        self._refresh = refresh
        self._slots: OrderedDict[int, _Slot] = OrderedDict()
        self._spare: list[bytearray] = []   # chunk buffers to fill again (no new allocation)
        self._next = -1          # chunk index a sequential reader touches next
        self.stats: Counter[str] = Counter() if stats is None else stats

    async def read(self, off: int, size: int) -> bytes | bytearray | memoryview:
        """Up to ``size`` bytes from ``off`` (fewer at the end of the file)."""
        end = min(off + size, self.size)
        if off >= end:
            return b""
        first, last = off // self.chunk_size, (end - 1) // self.chunk_size
        try:
            return await self._read(off, end, first, last)
        except Unavailable:
            # A data server may have come back at a new address: look the file
            # up again, then try once more before answering EIO.
            self.stats["refreshes"] += 1
            self.reader = await self._refresh()
            self.drop()
            return await self._read(off, end, first, last)

    async def _read(self, off: int, end: int, first: int, last: int
                    ) -> bytes | bytearray | memoryview:
        sequential = off == 0 or first in (self._next - 1, self._next)
        self._next = last + 1
        if not sequential and not all(i in self._slots for i in range(first, last + 1)):
            self.stats["ranged_reads"] += 1
            return await self.reader.read(off, end)
        self.stats["sequential"] += 1
        wanted = [self._slot(i) for i in range(first, last + 1)]
        for i in range(last + 1, min(last + 1 + self.readahead, self._count())):
            self._slot(i)
        base = first * self.chunk_size
        for slot in wanted:
            slot.pins += 1
        try:
            if len(wanted) == 1:               # the common case: no copy at all
                return memoryview(await wanted[0].task)[off - base:end - base]
            bufs = await asyncio.gather(*(slot.task for slot in wanted))
            return b"".join(bufs)[off - base:end - base]
        finally:
            # The caller answers the kernel before anything else runs on the loop,
            # so an unpinned buffer is free to be filled again after this.
            for slot in wanted:
                slot.pins -= 1

    def _count(self) -> int:
        return -(-self.size // self.chunk_size)

    def _slot(self, index: int) -> _Slot:
        slot = self._slots.get(index)
        if slot is not None and not (slot.task.done() and slot.task.exception() is not None):
            self._slots.move_to_end(index)
            return slot
        task = asyncio.ensure_future(self._fetch(index))
        task.add_done_callback(_quiet)
        slot = self._slots[index] = _Slot(task)
        self._evict()
        return slot

    async def _fetch(self, index: int) -> bytearray:
        length = chunk_length(self.chunk_size, self.size, index)
        # A new 4 MiB bytearray costs zeroing and page faults; a spare one costs nothing.
        buf = self._spare.pop() if self._spare and length == self.chunk_size \
            else bytearray(length)
        await self.reader.read_into(index * self.chunk_size, memoryview(buf))
        self.stats["chunks_fetched"] += 1
        return buf

    def _evict(self) -> None:
        for index in list(self._slots):
            if len(self._slots) <= self.capacity:
                return
            slot = self._slots[index]
            if slot.task.done() and not slot.pins:   # never what a reader may be awaiting
                del self._slots[index]
                self._recycle(slot.task)

    def _recycle(self, task: asyncio.Task[bytearray]) -> None:
        if task.cancelled() or task.exception() is not None or len(self._spare) >= SPARE:
            return
        buf = task.result()
        # Only the task and this frame hold it: no memoryview of it is alive anywhere.
        if len(buf) == self.chunk_size and sys.getrefcount(buf) <= 3:
            self._spare.append(buf)

    def drop(self) -> None:
        """Forget every chunk (fetches in flight finish for whoever awaits them)."""
        self._slots.clear()

    def close(self) -> None:
        """The last handle is gone: cancel the readahead nobody will read."""
        for slot in self._slots.values():
            slot.task.cancel()
        self._slots.clear()
        self._spare.clear()


def _quiet(task: asyncio.Task[bytearray]) -> None:
    """Readahead a reader never waited for may fail unseen; that is not an error."""
    if not task.cancelled():
        task.exception()
