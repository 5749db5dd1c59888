"""Open files and directories of the mount.

Writes: a file written through the mount is a *new version*, streamed to the
data servers as it is written (one :class:`~stager.dataplane.StripedWriter`)
and committed when a descriptor is closed (``flush``) or synced, so ``close``
reports every error and the file is visible to every client when ``close``
returns.  Writes must be sequential; anything else fails with ``EOPNOTSUPP``
and the half-written version is never committed.

When a descriptor writes again after such a commit (a shell's ``cmd > f``
closes a duplicate descriptor before ``cmd`` writes), the next version starts
with a copy of the committed one, so the result is the whole file.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import AsyncIterator

from ..client import AsyncClient
from ..dataplane import StripedWriter
from ..protocol.models import FileInfo
from .cache import ChunkCache
from .inodes import Node

log = logging.getLogger("stager.mount")


def unsupported(message: str) -> OSError:
    return OSError(errno.EOPNOTSUPP, message)


class ReadHandle:
    def __init__(self, node: Node, cache: ChunkCache, *, writable: bool) -> None:
        self.node = node
        self.cache = cache
        self.writable = writable       # O_RDWR on a committed file: reads only


class WriteHandle:
    """A new version of ``node``'s file, written front to back."""

    def __init__(self, client: AsyncClient, node: Node) -> None:
        self.client = client
        self.node = node
        self.pos = 0
        self.file_id: str | None = None
        self.writer: StripedWriter | None = None
        self.committed: FileInfo | None = None   # the last version committed here
        self.error: OSError | None = None        # set once: the version is lost
        self.mtime: float | None = None          # from futimens before close
        self.unlinked = False
        self.released = asyncio.Event()           # the kernel let go of the handle

    @property
    def dirty(self) -> bool:
        """Bytes written that no commit has made visible yet."""
        return self.writer is not None or self.committed is None

    async def begin(self, *, exclusive: bool = False) -> None:
        """Start an upload at the node's path (errors such as ENOSPC show here)."""
        self.file_id, self.writer = await self.client.create(self.node.path,
                                                             overwrite=not exclusive)

    async def write(self, off: int, data: bytes) -> int:
        if self.error is not None:
            raise self.error
        if off != self.pos:
            self.error = unsupported(
                f"{self.node.path}: write at {off}, but only sequential writes are "
                f"supported (next offset {self.pos}); this version will not be committed")
            await self._abort()
            raise self.error
        if not self.unlinked:
            if self.writer is None:
                await self._resume()
            assert self.writer is not None
            try:
                await self.writer.write(data)
            except BaseException as exc:
                await self._lose(exc)
                raise
        self.pos += len(data)
        return len(data)

    async def commit(self) -> FileInfo | None:
        """Make everything written so far visible; returns the committed info."""
        if self.error is not None:
            raise self.error
        if self.unlinked or not self.dirty:
            return self.committed
        if self.writer is None:
            await self._resume()
        assert self.file_id is not None and self.writer is not None
        try:
            info = await self.client.commit(self.file_id, self.writer, mtime=self.mtime)
        except BaseException as exc:
            await self._lose(exc)
            raise
        self.committed, self.file_id, self.writer = info, None, None
        return info

    async def discard(self) -> None:
        """The name was unlinked: later writes go nowhere, as on a local disk."""
        self.unlinked = True
        await self._abort()

    async def _resume(self) -> None:
        """A write after a commit: the next version begins as a copy of the last one."""
        await self.begin()
        assert self.writer is not None
        if self.committed is not None and self.committed.size:
            async for piece in self.client.reader(self.committed).stream():
                await self.writer.write(piece)

    async def _lose(self, exc: BaseException) -> None:
        self.error = exc if isinstance(exc, OSError) else OSError(errno.EIO, str(exc))
        await self._abort()

    async def _abort(self) -> None:
        if self.file_id is not None:
            await asyncio.shield(self.client.abort(self.file_id, self.writer))
        self.file_id = self.writer = None


class DirHandle:
    """A directory being listed, fetched from the metadata server a page at a time.

    ``readdir`` offsets are positions in the listing; entries fetched so far
    are kept, so the kernel may come back to any of them.
    """

    def __init__(self, client: AsyncClient, node: Node, page_size: int) -> None:
        self.client = client
        self.node = node
        self.page_size = page_size
        self.entries: list[FileInfo] = []
        self._pages: AsyncIterator[FileInfo] | None = None
        self._done = False

    async def entry(self, index: int) -> FileInfo | None:
        if index == 0 and (self.entries or self._done):
            await self.close()                 # rewinddir: list again
            self.entries, self._done = [], False
        if self._pages is None and not self._done:
            self._pages = self.client.iter_dir(self.node.path, page_size=self.page_size)
        while index >= len(self.entries) and not self._done:
            assert self._pages is not None
            try:
                self.entries.append(await anext(self._pages))
            except StopAsyncIteration:
                self._done = True
                self._pages = None
        return self.entries[index] if index < len(self.entries) else None

    async def close(self) -> None:
        if self._pages is not None:
            await self._pages.aclose()  # type: ignore[attr-defined]
            self._pages = None
