"""One batched read (``POST /v1/read``): many pieces of many chunks, in order.

Each chunk is opened once per request (its trailer read and checked once), and
the request is refused before its response starts when a chunk is missing or a
piece reaches past its end.  The pieces are then read a few MiB per thread hop,
each straight into the slice's one buffer: the blocks a piece touches are read
into a reused scratch buffer and checked against their CRCs (a 16 KiB piece
still costs its whole 64 KiB block: that is what its checksum covers), and only
the piece is copied out.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence

from ..errors import RangeNotSatisfiable, Unavailable
from ..protocol.models import ReadItem
from ..storage import ChunkStore, OpenChunk
from ..storage.chunkfile import block_span, read_verified_into

SLICE = 4 << 20         # bytes read per thread hop


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
        """The bytes of ``items``, concatenated (blocking)."""
        with self._lock:
            if self._closed:
                raise Unavailable("the batched read was abandoned")
            self._busy = True
        try:
            out = bytearray(sum(i.length for i in items))
            view = memoryview(out)
            spans = [block_span(self.chunks[i.chunk].meta, i.offset, i.length) for i in items]
            scratch = memoryview(bytearray(max((b - a for a, b in spans), default=0)))
            pos = 0
            for item in items:
                oc = self.chunks[item.chunk]
                read_verified_into(oc.fd, oc.meta, item.offset, view[pos:pos + item.length],
                                   scratch, item.chunk)
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
