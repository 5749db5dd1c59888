"""Copying one file into stager or out of it: the one copy path that staging and
the ``stager://`` filesystem's ``put``/``get`` share.

In: ranged reads of the source (up to ``window`` in flight) feed the striped
writer in order, and the writer keeps its own window of chunk PUTs in flight,
so a large file is read and written in parallel.  Each read is a whole number
of chunks and lands in a reused buffer, from which the writer sends its chunks
as they are: between the source and the data servers the bytes are not copied
(a plain-http source even has the kernel write them into that buffer, see
:class:`~stager.stage.httpraw.RawHttp`).  A small file is read in one
request.  A source that ignores byte ranges is read sequentially instead.  The
file becomes visible only when all of it is committed.

Out: a striped readahead stream feeds the destination.  The destination file
appears complete or not at all: a temporary name renamed into place, or an
upload that only commits on close.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractBufferedFile

from ..aio import cancel_and_wait
from ..dataplane import StripedWriter
from ..errors import SourceError
from ..protocol.models import FileInfo, LayoutSpec
from .source import Source

if TYPE_CHECKING:
    from ..client import AsyncClient

PART = 4 << 20       # bytes per ranged read of a source (rounded to whole chunks)
WINDOW = 8           # ranged reads of one file in flight
TMP_TAG = ".stager-tmp-"

OnBytes = Callable[[int], None]


class _RangesIgnored(Exception):
    """The source answered the first ranged read with the wrong number of bytes."""


class Buffers:
    """Up to ``count`` buffers, made when first needed and then reused: fresh memory
    costs a page fault and zeroing per page, more than the copy into it would.

    One pool serves every file a staging run copies at once.  A free buffer of
    another size (another file's chunk size) is dropped and one of the size
    asked for is made in its place, so ``count`` always bounds the memory.
    """

    def __init__(self, count: int) -> None:
        self._unmade = count
        self._free: asyncio.Queue[bytearray] = asyncio.Queue()

    def ready(self) -> bool:
        return self._unmade > 0 or not self._free.empty()

    async def get(self, size: int) -> bytearray:
        if self._free.empty() and self._unmade:
            self._unmade -= 1
            return bytearray(size)
        buf = await self._free.get()
        return buf if len(buf) == size else bytearray(size)

    def put(self, buf: bytearray) -> None:
        self._free.put_nowait(buf)

    def recycle(self, buf: bytearray, read: asyncio.Future[Any]) -> None:
        """Put ``buf`` back once the read into it is over.  A cancelled read may go on
        (a blocking source's thread cannot be stopped), so its buffer is never
        reused: it is left to that read, and another may be made in its place."""
        if read.done() and not read.cancelled():
            self.put(buf)
        else:
            self._unmade += 1


def buffers_for(files: int, window: int, chunks_in_flight: int) -> Buffers:
    """A pool for ``files`` copied at once: each has up to ``window`` reads in flight
    and its writer up to ``chunks_in_flight`` chunk PUTs, plus one being handed over."""
    return Buffers(files * (window + chunks_in_flight + 1))


async def _ranged_into(source: Source, path: str, size: int, part: int, window: int,
                       buffers: Buffers, etag: str | None = None
                       ) -> AsyncIterator[tuple[memoryview, bytearray]]:
    """The file's parts in order, each read into a buffer of ``buffers`` (which the
    consumer puts back), up to ``window`` reads in flight while buffers are free."""
    starts = iter(range(0, size, part))
    start: int | None = next(starts, None)
    pending: deque[tuple[int, bytearray, memoryview, asyncio.Task[int]]] = deque()
    try:
        while True:
            while start is not None and len(pending) < window and (
                    not pending or buffers.ready()):
                buf = await buffers.get(part)
                view = memoryview(buf)[:min(size, start + part) - start]
                pending.append((start, buf, view, asyncio.ensure_future(
                    source.read_into(path, start, view, etag=etag, size=size))))
                start = next(starts, None)
            if not pending:
                return
            at, buf, view, task = pending.popleft()
            try:
                got = await task
                if got != len(view):
                    if at == 0:
                        raise _RangesIgnored
                    raise SourceError(f"source {source.name(path)} sent {got} bytes for "
                                      f"[{at}, {at + len(view)}); it changed while staging",
                                      url=source.name(path))
            except BaseException:
                buffers.recycle(buf, task)
                raise
            yield view, buf
    finally:
        await cancel_and_wait(t for *_, t in pending)
        for _, buf, _, task in pending:
            buffers.recycle(buf, task)


async def _write_ranges(writer: StripedWriter, source: Source, path: str, size: int,
                        part: int, window: int, on_bytes: OnBytes,
                        buffers: Buffers | None, etag: str | None) -> None:
    """The whole file into ``writer``: ranged reads land in chunk-aligned buffers,
    whose chunks the writer sends as they are (no copy) and then hands back."""
    chunk = writer.layout.chunk_size
    part = max(1, part // chunk) * chunk
    if buffers is None:
        buffers = buffers_for(1, window, writer.max_in_flight)
    async with aclosing(_ranged_into(source, path, size, part, window, buffers,
                                     etag)) as parts:
        async for view, buf in parts:
            on_bytes(len(view))
            await writer.write_owned(view, partial(buffers.put, buf))


async def _write_stream(writer: StripedWriter, source: Source, path: str, size: int,
                        part: int, on_bytes: OnBytes) -> None:
    """The whole file into ``writer``, read sequentially (a source without ranges)."""
    total = 0
    async with aclosing(source.stream(path, part)) as pieces:
        async for data in pieces:
            total += len(data)
            if total > size:
                break
            on_bytes(len(data))
            await writer.write(data)
    if total != size:
        raise SourceError(f"source {source.name(path)} changed while staging: it has "
                          f"{'more than ' if total > size else ''}{total} bytes, "
                          f"listed as {size}", url=source.name(path))


async def copy_in(client: AsyncClient, source: Source, path: str, size: int, dst: str, *,
                  layout: LayoutSpec | None = None, mtime: float | None = None,
                  overwrite: bool = True, on_bytes: OnBytes | None = None,
                  part: int = PART, window: int = WINDOW,
                  buffers: Buffers | None = None, etag: str | None = None) -> FileInfo:
    """Stage one source file at ``dst``; visible only once all of it is committed.

    ``part`` (rounded to whole chunks) is the size of one ranged read, ``window``
    how many are in flight; ``buffers``: a pool shared with the other files
    copied at the same time (see :func:`buffers_for`), else one of its own.
    ``size`` and ``etag`` are the file as listed: a source whose reads tell
    otherwise fails the copy (it changed while staging).
    """
    count = on_bytes or (lambda n: None)
    file_id, writer = await client.create(dst, layout=layout, overwrite=overwrite)
    try:
        try:
            await _write_ranges(writer, source, path, size, part, window, count, buffers,
                                etag)
        except _RangesIgnored:      # raised by the first read: nothing written yet
            await _write_stream(writer, source, path, size, part, count)
        return await client.commit(file_id, writer, mtime=mtime)
    except BaseException:
        await asyncio.shield(client.abort(file_id, writer))
        raise


# -- out -------------------------------------------------------------------------------
class Sink(ABC):
    """One destination file being written; ``commit`` makes it appear whole."""

    @abstractmethod
    async def write(self, data: memoryview) -> None:
        raise NotImplementedError

    @abstractmethod
    async def commit(self, mtime: float) -> None:
        raise NotImplementedError

    @abstractmethod
    async def discard(self) -> None:
        raise NotImplementedError


class LocalSink(Sink):
    """A local file: written under a temporary name, renamed into place."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}{TMP_TAG}{uuid.uuid4().hex[:8]}")
        self.fh: Any = None

    async def open(self) -> LocalSink:
        def make() -> Any:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return open(self.tmp, "wb")
        self.fh = await asyncio.to_thread(make)
        return self

    async def write(self, data: memoryview) -> None:
        await asyncio.to_thread(self.fh.write, data)

    async def commit(self, mtime: float) -> None:
        def finish() -> None:
            self.fh.close()
            os.utime(self.tmp, (mtime, mtime))      # the staged mtime: reruns can skip it
            os.replace(self.tmp, self.path)
        await asyncio.to_thread(finish)

    async def discard(self) -> None:
        def drop() -> None:
            if self.fh is not None:
                self.fh.close()
            self.tmp.unlink(missing_ok=True)
        await asyncio.to_thread(drop)


class FsspecSink(Sink):
    """A file of any fsspec filesystem, written from a thread.

    Async filesystems (s3, gcs, azure, stager, …) upload on ``close`` and not
    before, so their files are written in place and discarded on failure.  Any
    other kind is written under a temporary name and moved into place.
    """

    def __init__(self, fs: Any, path: str) -> None:
        self.fs, self.path = fs, path
        head, _, tail = path.rpartition("/")
        self.direct = bool(getattr(fs, "async_impl", False))
        self.name = path if self.direct else f"{head}/.{tail}{TMP_TAG}{uuid.uuid4().hex[:8]}"
        self.f: Any = None

    async def open(self) -> FsspecSink:
        def make() -> Any:
            parent = self.fs._parent(self.path)
            if parent:
                self.fs.makedirs(parent, exist_ok=True)
            return self.fs.open(self.name, "wb")
        self.f = await asyncio.to_thread(make)
        return self

    async def write(self, data: memoryview) -> None:
        await asyncio.to_thread(self.f.write, bytes(data))

    async def commit(self, mtime: float) -> None:
        def finish() -> None:
            self.f.close()
            if not self.direct:
                self.fs.mv(self.name, self.path)
        await asyncio.to_thread(finish)

    async def discard(self) -> None:
        def drop() -> None:
            if self.f is None:
                return
            if isinstance(self.f, AbstractBufferedFile):
                self.f.discard()
                self.f.closed = True        # so that garbage collection cannot commit it
            else:
                self.f.close()
            if not self.direct and self.fs.exists(self.name):
                self.fs.rm(self.name)
        await asyncio.to_thread(drop)


async def open_sink(fs: Any, path: str) -> Sink:
    if isinstance(fs, LocalFileSystem):
        return await LocalSink(path).open()
    return await FsspecSink(fs, path).open()


async def copy_out(client: AsyncClient, info: FileInfo, fs: Any, path: str, *,
                   on_bytes: OnBytes | None = None) -> None:
    """Copy one stager file to ``path`` of the fsspec filesystem ``fs``."""
    sink = await open_sink(fs, path)
    try:
        async for piece in client.reader(info).stream():
            await sink.write(piece)
            if on_bytes is not None:
                on_bytes(len(piece))
        await sink.commit(info.mtime)
    except BaseException:
        await asyncio.shield(sink.discard())
        raise
