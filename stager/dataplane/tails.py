"""Read-ahead past a ranged read's end, kept a moment for the range that follows.

A client that reads a big object as a run of ranged GETs (s3fs: one range after
the other; boto3's ``download_fileobj``: 8 MiB ranges on 10 threads) makes the
gateway a new reader per range, and each would start cold: its first piece read
from a data server before its first byte goes out, while the connection idles.
So a sequential stream (from 0, or from where a stream begun lately ends: a
random ranged read does not read on) whose range ends before the file does, where
no stream is running yet, reads on past its end (as far again as its range: the
next range is likely as long; at most :data:`AHEAD`) into buffers parked here,
keyed by file version and offset; a stream that begins there takes them instead of
reading them again.  A piece parked is dropped after :data:`TTL` seconds, and the
oldest first beyond :data:`BUDGET` bytes per data plane, so memory stays bounded;
a file version's bytes never change, so a parked piece is never stale.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

AHEAD = 16 << 20        # bytes read past a range's end, at most
BUDGET = 64 << 20       # bytes parked per data plane, at most
TTL = 5.0               # seconds a parked piece is kept

Key = tuple[str, int]   # (file id, offset)


def _retrieve(task: asyncio.Future[None]) -> None:
    """A parked read nobody took may fail: its error is not an unretrieved one."""
    if not task.cancelled():
        task.exception()


class Tails:
    """The pieces parked for one data plane, and where streams began lately."""

    def __init__(self) -> None:
        self.parked: OrderedDict[Key, tuple[asyncio.Future[None], bytearray, float]] = \
            OrderedDict()
        self.reading: dict[Key, int] = {}       # streams running, by where they began
        self.stops: OrderedDict[Key, float] = OrderedDict()  # where streams end, when begun
        self.bytes = 0
        self.taken = self.dropped = 0           # pieces taken by a stream, dropped unused

    def begin(self, file_id: str, offset: int, stop: int) -> bool:
        """A stream of ``[offset, stop)`` begins: while it runs, no other reads ahead to
        ``offset``.  Whether it is sequential, so that reading on past ``stop`` pays:
        it begins at 0 or where a stream begun lately ends (a random ranged read would
        read as much again for nothing)."""
        self._expire()
        key = (file_id, offset)
        self.reading[key] = self.reading.get(key, 0) + 1
        self.stops[(file_id, stop)] = time.monotonic()
        self.stops.move_to_end((file_id, stop))
        return offset == 0 or key in self.stops

    def end(self, file_id: str, offset: int) -> None:
        key = (file_id, offset)
        left = self.reading.pop(key, 1) - 1
        if left:
            self.reading[key] = left

    def wanted(self, file_id: str, offset: int) -> bool:
        """Whether to read ahead from ``offset``: no stream that began there is running
        (boto3's ranges run ten at once) and nothing is parked there yet."""
        self._expire()
        return (file_id, offset) not in self.reading and (file_id, offset) not in self.parked

    def has(self, file_id: str, offset: int) -> bool:
        return (file_id, offset) in self.parked

    def take(self, file_id: str, offset: int, length: int
             ) -> tuple[asyncio.Future[None], bytearray] | None:
        """The read parked at ``offset`` if it holds at least ``length`` bytes and did
        not fail; it is the caller's from now on."""
        got = self.parked.pop((file_id, offset), None)
        if got is None:
            return None
        task, buf, _ = got
        self.bytes -= len(buf)
        if len(buf) < length or (task.done() and (task.cancelled() or task.exception())):
            task.cancel()
            self.dropped += 1
            return None
        self.taken += 1
        return task, buf

    def park(self, file_id: str, offset: int, task: asyncio.Future[None],
             buf: bytearray) -> None:
        task.add_done_callback(_retrieve)
        self.parked[(file_id, offset)] = (task, buf, time.monotonic())
        self.bytes += len(buf)
        while self.bytes > BUDGET and self.parked:
            self._drop(next(iter(self.parked)))

    def _drop(self, key: Key) -> None:
        task, buf, _ = self.parked.pop(key)
        self.bytes -= len(buf)
        self.dropped += 1
        task.cancel()

    def _expire(self) -> None:
        old = time.monotonic() - TTL
        while self.parked and next(iter(self.parked.values()))[2] < old:
            self._drop(next(iter(self.parked)))
        while self.stops and next(iter(self.stops.values())) < old:
            self.stops.popitem(last=False)
