"""File objects over the striped data path.

A reading file serves sequential reads from a readahead stream (the next
chunks are already in flight on their targets) and random reads by fetching
exactly the bytes they touch.  A writing file streams chunks out as they fill
and makes the file visible only on a successful ``close``.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ..dataplane import StripedWriter
from ..protocol.models import FileInfo

if TYPE_CHECKING:
    from .async_client import AsyncClient


class AsyncReadFile:
    def __init__(self, client: AsyncClient, info: FileInfo) -> None:
        self.client = client
        self.info = info
        self.reader = client.reader(info)
        self.size = info.size
        self.pos = 0
        self.closed = False
        self._stream: AsyncIterator[memoryview] | None = None
        self._stream_pos = 0          # file offset of the first byte of _pending
        self._pending = memoryview(b"")
        self._last_end = -1           # where the previous read ended

    @property
    def path(self) -> str:
        return self.info.path

    async def __aenter__(self) -> AsyncReadFile:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self.pos = base + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    async def read(self, size: int = -1) -> bytes:
        if self.closed:
            raise ValueError("read of a closed file")
        end = self.size if size is None or size < 0 else min(self.size, self.pos + size)
        if end <= self.pos:
            return b""
        out = bytearray(end - self.pos)
        await self.readinto(memoryview(out))
        return bytes(out)

    async def readinto(self, out: memoryview) -> int:
        n = max(0, min(len(out), self.size - self.pos))
        if n == 0:
            return 0
        sequential = self._sequential(n)
        if self._stream is not None and self._stream_pos == self.pos:
            await self._from_stream(out[:n])
        elif sequential and self.pos + n < self.size:
            await self._start_stream()
            await self._from_stream(out[:n])
        else:
            await self.reader.read_into(self.pos, out[:n])
        self.pos += n
        self._last_end = self.pos
        return n

    def _sequential(self, n: int) -> bool:
        """Whether a read of ``n`` bytes at ``pos`` should start a readahead stream."""
        # A second read that continues the previous one, or one large read,
        # means a sequential reader: serve it from a readahead stream.
        return self.pos == self._last_end or n >= self.reader.layout.chunk_size

    async def _start_stream(self) -> None:
        await self._stop_stream()
        self._stream = self.reader.stream(self.pos)
        self._stream_pos = self.pos
        self._pending = memoryview(b"")

    async def _from_stream(self, out: memoryview) -> None:
        assert self._stream is not None
        filled = 0
        while filled < len(out):
            if not self._pending:
                self._pending = await anext(self._stream)
            n = min(len(self._pending), len(out) - filled)
            out[filled:filled + n] = self._pending[:n]
            self._pending = self._pending[n:]
            filled += n
        self._stream_pos += filled

    async def _stop_stream(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()  # type: ignore[attr-defined]
            self._stream = None

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self._stop_stream()


class AsyncWriteFile:
    def __init__(self, client: AsyncClient, file_id: str, writer: StripedWriter) -> None:
        self.client = client
        self.file_id = file_id
        self.writer = writer
        self.closed = False
        self.info: FileInfo | None = None

    async def __aenter__(self) -> AsyncWriteFile:
        return self

    async def __aexit__(self, exc_type: type | None, *exc: object) -> None:
        if exc_type is None:
            await self.close()
        else:
            await self.discard()

    def tell(self) -> int:
        return self.writer.size

    async def write(self, data: bytes | bytearray | memoryview) -> int:
        if self.closed:
            raise ValueError("write to a closed file")
        try:
            return await self.writer.write(data)
        except BaseException:
            await self.discard()
            raise

    async def close(self) -> FileInfo | None:
        """Wait for every chunk, then commit: the file becomes visible."""
        if not self.closed:
            self.closed = True
            try:
                self.info = await self.client.commit(self.file_id, self.writer)
            except BaseException:
                await asyncio.shield(self.client.abort(self.file_id, self.writer))
                raise
        return self.info

    async def discard(self) -> None:
        """Abandon the write; nothing becomes visible."""
        if not self.closed:
            self.closed = True
            await asyncio.shield(self.client.abort(self.file_id, self.writer))
