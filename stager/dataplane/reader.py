"""Striped reads of one file: byte ranges planned as chunk pieces, run by the read engine."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable

from ..aio import cancel_and_wait
from ..layout import pieces
from ..protocol.models import FileInfo
from .engine import ReadEngine
from .readplan import FileTable, ReadOptions
from .tails import AHEAD, Tails
from .transport import DataPlane


class StripedReader:
    """Reads one committed file.  Safe to share between concurrent readers."""

    def __init__(self, plane: DataPlane, info: FileInfo, *, concurrency: asyncio.Semaphore,
                 readahead: int = 8, retries: int = 2) -> None:
        if info.layout is None or info.file_id is None:
            raise ValueError(f"{info.path} is not a file")
        self.info = info
        self.file_id = info.file_id
        self.layout = info.layout
        self.plane = plane
        self.readahead = max(1, readahead)
        # every whole chunk straight into the caller's buffer (sendfile on the server)
        self.engine = ReadEngine(plane, concurrency, ReadOptions(stream_above=0,
                                                                 retries=retries))
        self._table = FileTable([info])

    @property
    def size(self) -> int:
        return self.info.size

    async def read(self, start: int = 0, stop: int | None = None) -> bytearray:
        """Bytes ``[start, stop)`` (clipped to the file), all pieces fetched in parallel."""
        stop = self.size if stop is None else min(stop, self.size)
        start = min(max(start, 0), stop)
        out = bytearray(stop - start)
        await self.read_into(start, memoryview(out))
        return out

    async def read_into(self, start: int, out: memoryview) -> None:
        """Fill ``out`` with the file's bytes from ``start``; ``out`` must fit in the file."""
        if start + len(out) > self.size:
            raise ValueError("read past the end of the file")
        if not len(out):
            return
        await self.engine.run(self._table.plan_range(0, start, start + len(out)), [out])

    async def stream(self, start: int = 0, stop: int | None = None, *, lend: bool = False,
                     into: Callable[[int], memoryview] | None = None, block: int = 0,
                     ) -> AsyncIterator[memoryview]:
        """The bytes of ``[start, stop)`` in order, one chunk piece at a time, with
        the next ``readahead`` pieces already in flight on their targets.

        Each piece is a buffer of its own, the consumer's to keep.  With ``lend``
        it is only lent: a consumer that has copied it out hands it back with
        :meth:`give_back`, and a later piece is read into it instead of into a
        new buffer, which is zero-filled first (0.05-0.09 s of CPU per GB on the
        2-core build machine, of the ~0.4 s a GB costs the stream's thread).

        Without ``lend``, a range that ends before the file reads on past its end
        for the range that may follow where it is sequential (from 0, or from where
        a range ends), and takes what a range before it read on (:mod:`.tails`: a
        run of ranged GETs streams from its first byte).

        ``into``: each piece is read into the writable view ``into(length)`` makes
        (a file that returns its pieces as they are), ``block`` bytes from ``start``
        each (the last shorter) instead of one per chunk, with as many bytes in
        flight as ``readahead`` chunks."""
        stop = self.size if stop is None else min(stop, self.size)
        chunk = self.layout.chunk_size
        todo = ((p.file_offset, p.length) for p in pieces(chunk, self.size, start, stop)) \
            if into is None else ((at, min(block, stop - at)) for at in range(start, stop, block))
        ahead = self.readahead if into is None else max(1, self.readahead * chunk // block)
        window: deque[tuple[asyncio.Future[None], memoryview]] = deque()
        tails = None if lend or into or not stop > start else self.plane.tails
        sequential = tails is not None and tails.begin(self.file_id, start, stop)
        read_on = sequential and stop < self.size

        def launch() -> bool:
            nonlocal read_on
            piece = next(todo, None)
            if piece is None:
                if read_on:         # once: every piece of the range is on its way
                    read_on = False
                    self._read_on(tails, start, stop)
                return False
            offset, length = piece
            got = tails.take(self.file_id, offset, length) if tails is not None else None
            if got is not None:
                window.append((got[0], memoryview(got[1])[:length]))
                return True
            view = into(length) if into is not None else memoryview(
                self.engine.take(length) if lend else bytearray(length))
            window.append((asyncio.ensure_future(self.read_into(offset, view)), view))
            return True

        try:
            while len(window) < ahead and launch():
                pass
            while window:
                task, view = window.popleft()
                await task
                launch()
                yield view
        finally:
            if tails is not None:
                tails.end(self.file_id, start)
            await cancel_and_wait(t for t, _ in window)

    def _read_on(self, tails: Tails, start: int, stop: int) -> None:
        """Park reads of the bytes after ``stop``, as many as ``[start, stop)`` (at most
        AHEAD: the next range is likely as long), unless a stream is running from
        there or they are parked."""
        if not tails.wanted(self.file_id, stop):
            return
        end = min(self.size, stop + min(stop - start, AHEAD))
        for piece in pieces(self.layout.chunk_size, self.size, stop, end):
            if not tails.has(self.file_id, piece.file_offset):
                buf = bytearray(piece.length)
                task = asyncio.ensure_future(self.read_into(piece.file_offset,
                                                            memoryview(buf)))
                tails.park(self.file_id, piece.file_offset, task, buf)

    def give_back(self, piece: memoryview) -> None:
        """Take back a piece lent by ``stream(lend=True)``; the caller no longer
        reads it (kept as a spare within ``bytes_in_flight``, see ``ReadEngine``)."""
        self.engine.give_back(piece)
