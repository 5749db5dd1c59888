"""One batched read (the ``batch_read`` route): many pieces of many chunks, in order.

Each chunk is opened once per request (its trailer read and checked once), and
the request is refused before its response starts when a chunk is missing or a
piece reaches past its end.  The pieces are then read a few MiB per thread hop
into the slice's one buffer: the blocks a piece touches are read into a reused
scratch buffer and checked against their CRCs (a 16 KiB piece still costs its
whole 64 KiB block: that is what its checksum covers), and only the piece is
copied out.  Neighbouring pieces of one chunk share one read of their blocks
(up to :data:`WINDOW` bytes), so each block is read and checked once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence

from ..errors import RangeNotSatisfiable, Unavailable
from ..protocol.models import ReadItem
from ..storage import ChunkStore, OpenChunk
from ..storage.chunkfile import ChunkMeta, block_span, read_blocks_verified

SLICE = 4 << 20         # bytes read per thread hop
WINDOW = 1 << 20        # bytes of blocks read at once for neighbouring items


class BatchRead:
    """The open chunks of one batched read.  Built in a thread (it opens files)."""

    def __init__(self, store: ChunkStore, items: Sequence[ReadItem]) -> None:
        self.items = list(items)
        self.chunks: dict[str, OpenChunk] = {}
        self._lock = threading.Lock()
        self._busy = False
        self._closed = False
        try:
            for item in self.items:
                oc = self.chunks.get(item.chunk)
                if oc is None:
                    oc = self.chunks[item.chunk] = store.open(item.chunk)
                if item.offset + item.length > oc.meta.data_len:
                    raise RangeNotSatisfiable(
                        f"{item.chunk}: [{item.offset}, {item.offset + item.length}) is past "
                        f"its {oc.meta.data_len} bytes", chunk=item.chunk)
        except BaseException:
            self._close_all()
            raise
        self.total = sum(i.length for i in self.items)

    async def slices(self) -> AsyncIterator[bytearray]:
        """The pieces' bytes in order, verified, about :data:`SLICE` bytes at a time."""
        group: list[ReadItem] = []
        size = 0
        for item in self.items:
            group.append(item)
            size += item.length
            if size >= SLICE:
                yield await asyncio.to_thread(self.read, group)
                group, size = [], 0
        if group:
            yield await asyncio.to_thread(self.read, group)

    def read(self, items: Sequence[ReadItem]) -> bytearray:
        """The bytes of ``items``, concatenated (blocking).

        Items of one chunk whose blocks touch or overlap (the samples of a shuffled
        batch, a few to a block) share one read of their blocks, each block checked
        once: read per item, a block holding several of them was read and checked
        once for each, up to twice its chunk's size per request."""
        with self._lock:
            if self._closed:
                raise Unavailable("the batched read was abandoned")
            self._busy = True
        try:
            out = bytearray(sum(i.length for i in items))
            view = memoryview(out)
            runs = _windows([(i.chunk, *_span(self.chunks[i.chunk].meta, i)) for i in items])
            scratch = memoryview(bytearray(max((r[2] - r[1] for r in runs), default=0)))
            pos = 0
            for chunk, begin, end, first, last in runs:
                oc = self.chunks[chunk]
                blocks = scratch[:end - begin]
                read_blocks_verified(oc.fd, oc.meta, begin, blocks, chunk)
                for item in items[first:last]:
                    at = item.offset - begin
                    view[pos:pos + item.length] = blocks[at:at + item.length]
                    pos += item.length
            return out
        finally:
            with self._lock:
                self._busy = False
                if self._closed:
                    self._close_all()

    def close(self) -> None:
        """Close the chunks now, or when the read in progress in a thread ends (an
        abandoned request must not close a file under a read)."""
        with self._lock:
            self._closed = True
            if not self._busy:
                self._close_all()

    def _close_all(self) -> None:
        chunks, self.chunks = self.chunks, {}
        for oc in chunks.values():
            oc.close()


def _span(meta: ChunkMeta, item: ReadItem) -> tuple[int, int]:
    """The whole blocks ``item`` touches (none for an empty item)."""
    if not item.length:
        return item.offset, item.offset
    return block_span(meta, item.offset, item.length)


def _windows(spans: Sequence[tuple[str, int, int]]) -> list[tuple[str, int, int, int, int]]:
    """Runs of consecutive items, given as (chunk, block start, block stop) each,
    whose blocks are read together: same chunk, each item's blocks starting at
    or before the run's end (touching or overlapping) and not before its start,
    at most :data:`WINDOW` bytes (one item's blocks may be more).  Each run is
    (chunk, start, stop, first item, item after the last)."""
    runs: list[tuple[str, int, int, int, int]] = []
    for i, (chunk, a, b) in enumerate(spans):
        if runs:
            c, start, stop, first, _ = runs[-1]
            if c == chunk and start <= a <= stop and max(stop, b) - start <= WINDOW:
                runs[-1] = (c, start, max(stop, b), first, i + 1)
                continue
        runs.append((chunk, a, b, i, i + 1))
    return runs
