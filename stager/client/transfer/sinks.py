"""What a copy out of stager writes to: a destination file that appears whole or
not at all.

:class:`LocalSink` serves ``get`` (the CLI, ``Client``, the ``stager://``
filesystem) and stage-out to a local path: a temporary name of its own (two
copies to one destination never share one), written, given the source's mtime,
fsynced, renamed into place, its directory fsynced.  :class:`FsspecSink` serves
stage-out to any other fsspec URL.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractBufferedFile

from ...aio import fsync_dir

TMP_TAG = ".stager-tmp-"


def temporary_name(name: str) -> str:
    """A hidden name beside ``name`` that no other copy picks."""
    return f".{name}{TMP_TAG}{uuid.uuid4().hex[:8]}"


class Sink(ABC):
    """One destination file: :meth:`open`, :meth:`write` its bytes, then
    :meth:`commit` makes it appear whole, or :meth:`discard` leaves nothing."""

    @abstractmethod
    async def open(self) -> None:
        """Provided by each subclass."""

    @abstractmethod
    async def write(self, data: memoryview) -> None:
        """Provided by each subclass."""

    @abstractmethod
    async def commit(self, mtime: float) -> None:
        """Provided by each subclass."""

    @abstractmethod
    async def discard(self) -> None:
        """Provided by each subclass."""


class LocalSink(Sink):
    """A local file: written under a temporary name, renamed into place."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(temporary_name(self.path.name))
        self.fh: Any = None

    async def open(self) -> None:
        def make() -> Any:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return open(self.tmp, "xb")
        self.fh = await asyncio.to_thread(make)

    async def write(self, data: memoryview) -> None:
        await asyncio.to_thread(self.fh.write, data)

    async def commit(self, mtime: float) -> None:
        def finish() -> None:
            self.fh.flush()
            fd = self.fh.fileno()
            os.utime(fd, (mtime, mtime))       # the source's mtime: reruns can skip it
            os.fsync(fd)
            self.fh.close()
            os.replace(self.tmp, self.path)
            fsync_dir(self.path.parent)
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
        self.parent = head          # made first when missing
        self.direct = bool(getattr(fs, "async_impl", False))
        self.name = path if self.direct else f"{head}/{temporary_name(tail)}"
        self.f: Any = None

    async def open(self) -> None:
        def make() -> Any:
            if self.parent:
                self.fs.makedirs(self.parent, exist_ok=True)
            return self.fs.open(self.name, "wb")
        self.f = await asyncio.to_thread(make)

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


def sink_for(fs: Any, path: str) -> Sink:
    """The sink for ``path`` of the fsspec filesystem ``fs``."""
    return LocalSink(path) if isinstance(fs, LocalFileSystem) else FsspecSink(fs, path)
