"""File objects over the striped data path.

A reading file serves sequential reads from a readahead stream (the next
chunks are already in flight on their targets) and random reads by fetching
exactly the bytes they touch.  A writing file streams chunks out as they fill
and makes the file visible only on a successful ``close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import io
import platform
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ..dataplane import StripedWriter
from ..errors import NotFound, TargetUnavailable
from ..protocol.models import FileInfo
from .stale import gone_while_open

if TYPE_CHECKING:
    from .async_client import AsyncClient


class AsyncReadFile:
    """A seekable file reading through the striped reader.

    A read continuing the previous ones (``stream_after`` of them in a row), or
    one of a whole chunk or more when ``large_reads_stream``, starts a readahead
    stream; later reads take their bytes from it while it stays in step.  The
    stream's pieces are lent buffers: :meth:`read` joins them into its ``bytes``
    with one copy (:meth:`read_parts` leaves the join to the caller) and
    :meth:`readinto` copies them into the caller's buffer, so a sequential reader
    pays one copy per byte, and the pieces it has copied out are refilled by the
    readahead instead of new, zero-filled buffers.

    ``in_place``: a read outside the stream (of ``IN_PLACE_MIN`` bytes or more) is
    received straight into the ``bytes`` object it returns (:func:`fresh_bytes`),
    and a stream started by a
    read of whole chunks (from a chunk's start) reads ahead in pieces of that
    read's length, each received into the ``bytes`` it becomes; a read that takes
    such a piece whole returns it as its only part, and ``b"".join`` of one
    ``bytes`` copies nothing.  For a caller that returns ``bytes`` (fsspec's
    ``read``).
    """

    def __init__(self, client: AsyncClient, info: FileInfo, *, stream_after: int = 1,
                 large_reads_stream: bool = True, in_place: bool = False) -> None:
        self.client = client
        self.info = info
        self.reader = client.reader(info)
        self.size = info.size
        self.pos = 0
        self.closed = False
        self.stream_after = stream_after
        self.large_reads_stream = large_reads_stream
        self.in_place = in_place and _BYTES_IN_PLACE
        self._stream: AsyncIterator[memoryview] | None = None
        self._lent = True             # the stream's pieces are the reader's, to give back
        self._stream_pos = 0          # file offset of the first byte of _pending
        self._piece: memoryview | None = None     # the stream's piece _pending is the rest of
        self._pending = memoryview(b"")
        self._spent: list[memoryview] = []        # pieces read to their end, still lent out
        self._last_end = -1           # where the previous read ended
        self._run = 0                 # reads in a row that continued the one before

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
        data = b"".join(await self.read_parts(size))
        self._recycle()
        return data

    async def read_parts(self, size: int = -1, *, reuse: bool = False,
                         ) -> list[memoryview | bytes]:
        """The next ``size`` bytes (all when negative), as views of the buffers they
        arrived in: joining them is the one copy a ``bytes`` result needs, which a
        caller on another thread can make there while this loop reads on.

        ``reuse``: the caller has copied out the parts of the reads before, so the
        readahead may refill their buffers; the parts returned are then valid
        until the next ``read_parts(reuse=True)``.  Without it they are the
        caller's to keep."""
        if self.closed:
            raise ValueError("read of a closed file")
        if reuse:
            self._recycle()
        else:
            self._spent.clear()        # the caller may still hold them: never refilled
        end = self.size if size is None or size < 0 else min(self.size, self.pos + size)
        n = end - self.pos
        if n <= 0:
            return []
        async with self._own_version():
            if await self._streaming(n, in_place=self.in_place):
                parts = await self._take(n)
            elif self.in_place and n >= IN_PLACE_MIN:   # no zero-filled buffer, no copy
                view = fresh_bytes(n)
                await self.reader.read_into(self.pos, view)
                parts = [view.obj.result]  # type: ignore[attr-defined]
            else:
                parts = [memoryview(await self.reader.read(self.pos, end))]
        self._advance(n)
        return parts

    async def readinto(self, out: memoryview) -> int:
        n = max(0, min(len(out), self.size - self.pos))
        if n == 0:
            return 0
        self._spent.clear()            # lent out by an earlier read_parts: not ours to refill
        async with self._own_version():
            if await self._streaming(n):
                filled = 0
                for part in await self._take(n):
                    out[filled:filled + len(part)] = part
                    filled += len(part)
                self._recycle()
            else:
                await self.reader.read_into(self.pos, out[:n])
        self._advance(n)
        return n

    @contextlib.asynccontextmanager
    async def _own_version(self) -> AsyncIterator[None]:
        """A read of this file's own version: when its chunks are gone (the path was
        written again or removed elsewhere, and the old chunks collected), a clean
        ``NotFound`` (open it again) rather than another version's bytes
        (:func:`~stager.client.stale.gone_while_open`)."""
        try:
            yield
        except (TargetUnavailable, NotFound) as exc:
            await self._stop_stream()           # a stream that failed reads no more
            error = await gone_while_open(self.client, self.info, exc)
            if error is exc:
                raise
            raise error from exc

    async def _streaming(self, n: int, *, in_place: bool = False) -> bool:
        """Whether the read of ``n`` bytes at ``pos`` comes from the readahead stream
        (started here when the read looks sequential and more bytes follow it;
        ``in_place``: a stream for reads that return its pieces, see the class doc)."""
        self._run = self._run + 1 if self.pos == self._last_end else 0
        if self._stream is not None and self._stream_pos == self.pos:
            return True
        sequential = self._run >= self.stream_after or (
            self.large_reads_stream and n >= self.reader.layout.chunk_size)
        if sequential and self.pos + n < self.size:
            await self._start_stream(n, in_place)
            return True
        return False

    def _advance(self, n: int) -> None:
        self.pos += n
        self._last_end = self.pos

    async def _start_stream(self, n: int, in_place: bool) -> None:
        """A readahead stream from ``pos``, started by a read of ``n`` bytes."""
        await self._stop_stream()
        chunk = self.reader.layout.chunk_size
        self._lent = not (in_place and n % chunk == 0 and self.pos % chunk == 0)
        self._stream = self.reader.stream(self.pos, lend=True) if self._lent else \
            self.reader.stream(self.pos, into=fresh_bytes, block=n)
        self._stream_pos = self.pos
        self._piece, self._pending = None, memoryview(b"")

    async def _take(self, n: int) -> list[memoryview | bytes]:
        """The stream's next ``n`` bytes, as views of its pieces (not copied); a piece
        of an in-place stream taken whole as the ``bytes`` it was received into."""
        assert self._stream is not None
        parts: list[memoryview | bytes] = []
        left = n
        while left:
            if not self._pending:
                self._piece = self._pending = await anext(self._stream)
            part = self._pending[:left]
            self._pending = self._pending[len(part):]
            left -= len(part)
            if self._pending:
                parts.append(part)
                continue
            assert self._piece is not None
            if self._lent:
                parts.append(part)
                self._spent.append(self._piece)
            else:
                whole = len(part) == len(self._piece)
                parts.append(self._piece.obj.result if whole else part)  # type: ignore[union-attr]
            self._piece = None
        self._stream_pos += n
        return parts

    def _recycle(self) -> None:
        """The spent pieces' bytes have been copied out: back to the reader, to be
        refilled by the readahead."""
        for piece in self._spent:
            self.reader.give_back(piece)
        self._spent.clear()

    async def _stop_stream(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()  # type: ignore[attr-defined]
            self._stream = None

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self._stop_stream()


# A read outside the stream goes in place from this size: below it, the ctypes
# array type made for each new length (45 us) costs more than the copy it saves.
IN_PLACE_MIN = 1 << 20
_BYTES_IN_PLACE = platform.python_implementation() == "CPython"
if _BYTES_IN_PLACE:
    _new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
    _new_bytes.restype = ctypes.py_object
    _new_bytes.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)


def fresh_bytes(n: int) -> memoryview:
    """A writable view of a new, uninitialised ``bytes`` object of ``n`` bytes (the
    view's ``obj.result``), for a read to receive into before anyone sees it.

    This is how C code builds a ``bytes`` (``PyBytes_FromStringAndSize(NULL, n)``,
    then fill it): the object is immutable once handed out, and nothing writes to
    it after its read has finished.  A read that returns ``bytes`` then costs no
    copy at all, instead of one from a receive buffer (0.1 CPU s/GB on the 2-core
    build machine).  The view's array keeps the object alive while a read that was
    cancelled may still be writing to it."""
    result = _new_bytes(None, n)
    address = ctypes.cast(ctypes.c_char_p(result), ctypes.c_void_p).value
    array = (ctypes.c_ubyte * n).from_address(address)
    array.result = result  # type: ignore[attr-defined]
    return memoryview(array).cast("B")


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
