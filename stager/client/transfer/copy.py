"""Copying one file into stager or out of it: the one copy path that ``put``,
``get`` (CLI, ``Client``, the ``stager://`` filesystem) and staging share.

In: ranged reads of the source (up to ``window`` in flight) feed the striped
writer in order, and the writer keeps its own window of chunk PUTs in flight,
so a large file is read and written in parallel.  Each read is a whole number
of chunks and lands in a reused buffer, from which the writer sends its chunks
as they are: between the source and the data servers the bytes are not copied
(a plain-http source even has the kernel write them into that buffer, see
:class:`~stager.client.transfer.httpraw.RawHttp`).  A source that ignores byte ranges is
read sequentially instead.  The file becomes visible only when all of it is
committed.

Out: a striped readahead stream feeds a :class:`~.sinks.Sink`, which makes the
destination file appear whole, with the stager file's mtime, or not at all.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import aclosing
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from ...aio import cancel_and_wait, gather_or_cancel
from ...dataplane import StripedWriter
from ...errors import SourceError
from ...protocol.models import FileInfo, LayoutSpec
from ...sources.source import Source
from ..rewrite import written_again
from .sinks import Sink

if TYPE_CHECKING:
    from ..async_client import AsyncClient

T = TypeVar("T")
PART = 4 << 20       # bytes per ranged read of a source (rounded to whole chunks)
WINDOW = 8           # ranged reads of one file in flight

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

    async def write() -> FileInfo:
        sent = 0

        def counted(n: int) -> None:
            nonlocal sent
            sent += n
            count(n)

        file_id, writer = await client.create(dst, layout=layout, overwrite=overwrite)
        try:
            try:
                await _write_ranges(writer, source, path, size, part, window, counted,
                                    buffers, etag)
            except _RangesIgnored:      # raised by the first read: nothing written yet
                await _write_stream(writer, source, path, size, part, counted)
            return await client.commit(file_id, writer, mtime=mtime)
        except BaseException:
            await asyncio.shield(client.abort(file_id, writer))
            count(-sent)        # a write again counts its bytes again
            raise

    # The source is read by path: a failed write can be written again, whole.
    return await written_again(write, client.config.write_retries if overwrite else 0)


async def copy_out(client: AsyncClient, info: FileInfo, sink: Sink, *,
                   on_bytes: OnBytes | None = None) -> None:
    """Copy the stager file ``info`` into ``sink``, which it opens and commits with
    the file's mtime (or discards, on any failure)."""
    await sink.open()
    try:
        async for piece in client.reader(info).stream():
            await sink.write(piece)
            if on_bytes is not None:
                on_bytes(len(piece))
        await sink.commit(info.mtime)
    except BaseException:
        await asyncio.shield(sink.discard())
        raise


async def run_pool(items: Iterable[T], workers: int,
                   work: Callable[[T], Awaitable[None]]) -> None:
    """``work(item)`` for every item, ``workers`` at a time; the first error cancels."""
    queue = iter(items)

    async def worker() -> None:
        for item in queue:          # one shared iterator: each item goes to one worker
            await work(item)

    await gather_or_cancel(worker() for _ in range(max(1, workers)))
