"""What a copy into stager reads from: the :class:`Source` face, and local files.

A copy in (:func:`~stager.client.transfer.copy.copy_in`) and the small-file
groups (:class:`~stager.client.transfer.small.SmallFiles`) read through this
face only.  :class:`LocalSource` serves ``put`` (the CLI, ``Client``, the
``stager://`` filesystem); staging reads any fsspec URL through
:class:`stager.stage.source.Source`, which has the same face.  A source turns
its own errors into stager's: a missing file is :class:`NotFound`, anything
else that goes wrong reading it :class:`SourceError`, both naming the file.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ...errors import NotFound, SourceError


@dataclass(frozen=True)
class SourceFile:
    """One file of a source, as listed."""

    path: str                 # in the source
    rel: str                  # relative to the source root
    size: int
    mtime: float | None
    etag: str | None


class Source(Protocol):
    """Reads files of one source (a local tree, any fsspec URL)."""

    def name(self, path: str) -> str:
        """A URL or path naming ``path`` for messages."""
        ...

    async def read_into(self, path: str, start: int, out: memoryview, *,
                        etag: str | None = None, size: int | None = None) -> int:
        """Bytes from ``start`` into ``out``; how many the source sent (fewer at the
        end of the file, more when it ignored the range).  ``etag``, ``size``: the
        file as listed, checked where the source tells them with a read."""
        ...

    async def read_listed(self, path: str, size: int, etag: str | None) -> bytes:
        """The whole file, which must still be ``size`` bytes (and ``etag``)."""
        ...

    def stream(self, path: str, piece: int) -> AsyncIterator[bytes]:
        """The file from its start, one sequential read at a time (no byte ranges)."""
        ...


class LocalSource:
    """Files of the local file system, read in threads."""

    def name(self, path: str) -> str:
        return path

    async def read_into(self, path: str, start: int, out: memoryview, *,
                        etag: str | None = None, size: int | None = None) -> int:
        return await asyncio.to_thread(self._pread, path, start, out)

    async def read_listed(self, path: str, size: int, etag: str | None) -> bytes:
        with self._reading(path):
            data = await asyncio.to_thread(Path(path).read_bytes)
        if len(data) != size:
            raise SourceError(f"{path} changed while copying: it has {len(data)} bytes, "
                              f"listed as {size}", url=path)
        return data

    async def stream(self, path: str, piece: int) -> AsyncIterator[bytes]:
        with self._reading(path):
            fh = await asyncio.to_thread(open, path, "rb")
        try:
            while True:
                with self._reading(path):
                    data = await asyncio.to_thread(fh.read, piece)
                if not data:
                    return
                yield data
        finally:
            fh.close()

    def _pread(self, path: str, start: int, out: memoryview) -> int:
        """``out`` filled from ``start``, until full or the end of the file."""
        with self._reading(path):
            fd = os.open(path, os.O_RDONLY)
            try:
                pos = 0
                while pos < len(out) and (n := os.preadv(fd, [out[pos:]], start + pos)):
                    pos += n
                return pos
            finally:
                os.close(fd)

    @staticmethod
    @contextmanager
    def _reading(path: str) -> Iterator[None]:
        try:
            yield
        except FileNotFoundError as exc:
            raise NotFound(f"{path}: no such file", path=path) from exc
        except OSError as exc:
            raise SourceError(f"cannot read {path}: {exc.strerror or exc}", url=path) from exc


def local_tree(root: Path) -> list[SourceFile]:
    """Every file below ``root``, in path order (blocking: call it in a thread)."""
    return [_local(p, p.relative_to(root).as_posix()) for p in sorted(root.rglob("*"))
            if p.is_file()]


def local_file(path: Path) -> SourceFile:
    """The local file ``path`` (blocking); :class:`NotFound` when there is none."""
    with LocalSource._reading(str(path)):
        return _local(path, path.name)


def _local(path: Path, rel: str) -> SourceFile:
    st = path.stat()
    return SourceFile(str(path), rel, st.st_size, st.st_mtime, None)
