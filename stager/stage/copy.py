"""Copying one file into stager or out of it: the one copy path that staging and
the ``stager://`` filesystem's ``put``/``get`` share.

In: ranged reads of the source (up to ``window`` in flight) feed the striped
writer in order, and the writer keeps its own window of chunk PUTs in flight,
so a large file is read and written in parallel.  A small file is read in one
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractBufferedFile

from ..aio import cancel_and_wait
from ..errors import SourceError
from ..protocol.models import FileInfo, LayoutSpec
from .source import Source

if TYPE_CHECKING:
    from ..client import AsyncClient

PART = 4 << 20       # bytes per ranged read of a source
WINDOW = 8           # ranged reads of one file in flight
TMP_TAG = ".stager-tmp-"

OnBytes = Callable[[int], None]


class _RangesIgnored(Exception):
    """The source answered the first ranged read with the wrong number of bytes."""


async def source_bytes(source: Source, path: str, size: int, *, part: int = PART,
                       window: int = WINDOW) -> AsyncIterator[bytes]:
    """The bytes of a ``size``-byte source file, in order."""
    if size <= part:
        yield await source.read_all(path)
        return
    parts = _ranged(source, path, size, part, window)
    try:
        first = await anext(parts)
    except _RangesIgnored:
        await parts.aclose()
        async for data in source.stream(path, part):
            yield data
        return
    yield first
    async with aclosing(parts):
        async for data in parts:
            yield data


async def _ranged(source: Source, path: str, size: int, part: int, window: int
                  ) -> AsyncIterator[bytes]:
    starts = iter(range(0, size, part))
    pending: deque[tuple[int, asyncio.Task[bytes]]] = deque()

    def launch() -> None:
        start = next(starts, None)
        if start is not None:
            task = asyncio.ensure_future(source.read(path, start, min(size, start + part)))
            pending.append((start, task))

    try:
        for _ in range(window):
            launch()
        while pending:
            start, task = pending.popleft()
            data = await task
            want = min(size, start + part) - start
            if len(data) != want:
                if start == 0:
                    raise _RangesIgnored
                raise SourceError(f"source {source.name(path)} sent {len(data)} bytes for "
                                  f"[{start}, {start + want}); it changed while staging",
                                  url=source.name(path))
            launch()
            yield data
    finally:
        await cancel_and_wait(t for _, t in pending)


async def copy_in(client: AsyncClient, source: Source, path: str, size: int, dst: str, *,
                  layout: LayoutSpec | None = None, mtime: float | None = None,
                  overwrite: bool = True, on_bytes: OnBytes | None = None) -> FileInfo:
    """Stage one source file at ``dst``; visible only once all of it is committed."""

    async def body() -> AsyncIterator[bytes]:
        total = 0
        async with aclosing(source_bytes(source, path, size)) as parts:
            async for data in parts:
                total += len(data)
                if total > size:
                    break
                if on_bytes is not None:
                    on_bytes(len(data))
                yield data
        if total != size:
            raise SourceError(f"source {source.name(path)} changed while staging: it has "
                              f"{'more than ' if total > size else ''}{total} bytes, "
                              f"listed as {size}", url=source.name(path))

    async with aclosing(body()) as data:
        return await client.write_stream(dst, data, layout=layout, overwrite=overwrite,
                                         mtime=mtime)


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
