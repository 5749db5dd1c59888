"""Striped reads: chunk locations from the layout, many targets at once, replica failover."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

from ..aio import cancel_and_wait, gather_or_cancel
from ..checksum import crc32c
from ..errors import (
    ChunkNotFound,
    CorruptChunk,
    StagerError,
    StorageError,
    TargetUnavailable,
)
from ..layout import Piece, chunk_length, chunk_targets, pieces
from ..protocol.models import FileInfo, chunk_id
from .transport import DataPlane

# Errors after which another replica may still have good bytes.
FAILOVER_ERRORS = (TargetUnavailable, CorruptChunk, ChunkNotFound, StorageError)


class StripedReader:
    """Reads one committed file.  Safe to share between concurrent readers."""

    def __init__(self, plane: DataPlane, info: FileInfo, *, concurrency: asyncio.Semaphore,
                 readahead: int = 8, retries: int = 2) -> None:
        if info.layout is None or info.file_id is None:
            raise ValueError(f"{info.path} is not a file")
        self.plane = plane
        self.info = info
        self.layout = info.layout
        self.limit = concurrency
        self.readahead = max(1, readahead)
        self.retries = retries

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
        jobs = [
            self._fetch(p, out[p.file_offset - start:p.file_offset - start + p.length])
            for p in pieces(self.layout.chunk_size, self.size, start, start + len(out))
        ]
        await gather_or_cancel(jobs)

    async def stream(self, start: int = 0, stop: int | None = None,
                     ) -> AsyncIterator[memoryview]:
        """The bytes of ``[start, stop)`` in order, one chunk piece at a time, with
        the next ``readahead`` pieces already in flight on their targets."""
        stop = self.size if stop is None else min(stop, self.size)
        todo = iter(pieces(self.layout.chunk_size, self.size, start, stop))
        window: deque[tuple[asyncio.Task[None], bytearray]] = deque()

        def launch() -> bool:
            piece = next(todo, None)
            if piece is None:
                return False
            buf = bytearray(piece.length)
            window.append((asyncio.ensure_future(self._fetch(piece, memoryview(buf))), buf))
            return True

        try:
            while len(window) < self.readahead and launch():
                pass
            while window:
                task, buf = window.popleft()
                await task
                launch()
                yield memoryview(buf)
        finally:
            await cancel_and_wait(t for t, _ in window)

    async def _fetch(self, piece: Piece, out: memoryview) -> None:
        """One chunk piece, trying each replica, then again after a pause."""
        assert self.info.file_id is not None
        name = chunk_id(self.info.file_id, piece.index)
        whole = piece.offset == 0 and piece.length == chunk_length(
            self.layout.chunk_size, self.size, piece.index)
        errors: list[StagerError] = []
        replicas = chunk_targets(self.layout, piece.index)
        for attempt in range(self.retries + 1):
            order = self.plane.order_replicas(replicas)
            for j, target in enumerate(order):
                # Give a silent replica up quickly while another can be tried.
                patient = len(set(replicas)) == 1 or (
                    attempt == self.retries and j == len(order) - 1)
                url = self.info.locations.get(target)
                if url is None:
                    errors.append(TargetUnavailable(f"target {target} is unknown",
                                                    target=target))
                    continue
                try:
                    async with self.limit:
                        stored = await self.plane.read_chunk_into(
                            target, url, name, piece.offset, out, whole=whole, patient=patient)
                    if whole:
                        self._verify(piece.index, out, target, stored)
                    return
                except FAILOVER_ERRORS as exc:
                    errors.append(exc)
            if all(isinstance(e, CorruptChunk) for e in errors):
                break  # every replica answered, every one is bad: retrying will not help
            if attempt < self.retries:
                await asyncio.sleep(0.1 * 2 ** attempt)
        raise _final_error(name, errors)

    def _verify(self, index: int, out: memoryview, target: str, stored: int | None) -> None:
        """Check a whole chunk end to end: against the CRC committed with the file,
        or, when the caller has no checksums, the one the target stored at write."""
        sums = self.info.checksums
        expected = sums[index] if sums is not None and index < len(sums) else stored
        if expected is None:
            raise CorruptChunk(f"target {target} sent chunk {index} without a checksum",
                               target=target)
        actual = crc32c(out)
        if actual != expected:
            self.plane.counter(target).errors += 1     # the target sent bad bytes
            raise CorruptChunk(
                f"chunk {index} of {self.info.path} from target {target}: CRC32C {actual:08x},"
                f" expected {expected:08x}", path=self.info.path, chunk=index, target=target)


def _final_error(name: str, errors: list[StagerError]) -> StagerError:
    last = errors[-1] if errors else TargetUnavailable(f"no replica of {name} is reachable")
    if all(isinstance(e, CorruptChunk) for e in errors):
        return CorruptChunk(f"every replica of chunk {name} is corrupt", chunk=name)
    targets = sorted({str(e.details.get("target")) for e in errors if e.details.get("target")})
    if isinstance(last, TargetUnavailable | ChunkNotFound):
        return TargetUnavailable(f"chunk {name} unavailable: {last}", chunk=name,
                                 targets=targets, target=targets[0] if targets else None)
    return last

