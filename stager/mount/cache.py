"""The read side of an open file: whole chunks, fetched ahead of a sequential reader.

The kernel sends reads of up to 1 MiB, several at once and slightly out of
order (its own readahead).  Answering each with its own ranged request would
cost one round trip per MiB; instead a sequential reader is served from whole
chunks that :class:`~stager.dataplane.StripedReader` fetches (verified against
their committed CRC32C, with replica failover), and the next
``readahead`` chunks are already in flight on their targets, so every
stripe target works at once.  A read that does not follow the previous one is
served by a ranged read of exactly its bytes and starts no readahead.

One :class:`ChunkCache` per open inode, shared by its file handles; its chunk
buffers come from, and go back to, the mount's :class:`~.buffers.BufferPool`.
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
from .buffers import Buffer, BufferPool

Refresh = Callable[[], Awaitable[StripedReader]]


def cache_slots(readahead: int) -> int:
    """Chunks one open file keeps: those ahead of the reader, and as many behind it
    for the kernel's reads that come slightly out of order."""
    return 2 * max(0, readahead) + 2


@dataclass(eq=False)
class _Slot:
    task: asyncio.Task[Buffer]
    pins: int = 0            # readers between asking for the chunk and answering with it


class ChunkCache:
    def __init__(self, reader: StripedReader, *, readahead: int, refresh: Refresh,
                 pool: BufferPool, stats: Counter[str] | None = None) -> None:
        self.reader = reader
        self.size = reader.size
        self.chunk_size = reader.layout.chunk_size
        self.readahead = max(0, readahead)
        self.capacity = cache_slots(self.readahead)
        self._refresh = refresh
        self._slots: OrderedDict[int, _Slot] = OrderedDict()
        self.pool = pool
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

    async def _fetch(self, index: int) -> Buffer:
        buf = self.pool.take(chunk_length(self.chunk_size, self.size, index))
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

    def _recycle(self, task: asyncio.Task[Buffer]) -> None:
        if not task.done() or task.cancelled() or task.exception() is not None:
            return
        buf = task.result()
        # Only the task and this frame hold it: no memoryview of it is alive anywhere.
        # A file's last chunk is shorter, and rarely of a length another file wants.
        if len(buf) == self.chunk_size and sys.getrefcount(buf) <= 3:
            self.pool.give(buf)

    def drop(self) -> None:
        """Forget every chunk (fetches in flight finish for whoever awaits them)."""
        self._slots.clear()

    def close(self) -> None:
        """The last handle is gone: cancel the readahead nobody will read, keep the
        buffers of what was read for the next file."""
        for slot in self._slots.values():
            self._recycle(slot.task)
            slot.task.cancel()
        self._slots.clear()


def _quiet(task: asyncio.Task[Buffer]) -> None:
    """Readahead a reader never waited for may fail unseen; that is not an error."""
    if not task.cancelled():
        task.exception()
