"""Writing small files in groups, as a listing finds them: how ``put`` of a tree
and staging both write files up to one source read (:data:`~.copy.PART`).

One at a time, a small file would cost a create and a commit on the metadata
server and a chunk request per replica, each waiting on an fsync.  Here files go
in groups (up to :data:`GROUP_FILES` files or :data:`GROUP_BYTES` bytes), formed
in the order they are :meth:`SmallFiles.add`-ed, so that the first groups are
written while the rest of the source is still being listed.  A file comes with
its bytes when the listing already read them (a plain-http probe holds a whole
small file); the others are read when their group is written,
``files_in_flight`` at a time across all groups.  Each group is written with one
:meth:`AsyncClient.write_many` (one create batch, chunk batches per target, one
commit batch); :data:`GROUPS_IN_FLIGHT` are written at once, one more waits full,
one fills: that bounds the bytes held.  Every file becomes visible only once
committed, whole; the first failure cancels the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...aio import gather_or_cancel
from ...errors import StagerError
from ...protocol.models import FileInfo, LayoutSpec
from ...sources.source import Source, SourceFile

if TYPE_CHECKING:
    from ..async_client import AsyncClient

GROUP_FILES = 512                # small files per write_many call
GROUP_BYTES = 32 << 20           # and at most this many bytes
GROUPS_IN_FLIGHT = 3

Naming = Callable[[StagerError, SourceFile], StagerError]
Item = tuple[SourceFile, bytes | None]


def _same(exc: StagerError, f: SourceFile) -> StagerError:
    return exc


def _nothing(*_: object) -> None:
    return None


class SmallFiles:
    """Small files written in groups: :meth:`add` each, then :meth:`close`, while
    :meth:`run` writes them; ``copied`` is ``rel → FileInfo`` of every file committed.

    ``destination(f)``: the stager path of ``f``; ``naming(exc, f)``: the error to
    raise for ``f`` (``exc`` itself by default); ``on_bytes``, ``on_file``: progress.
    """

    def __init__(self, client: AsyncClient, source: Source,
                 destination: Callable[[SourceFile], str], *,
                 layout: LayoutSpec | None, overwrite: bool = True, files_in_flight: int,
                 on_bytes: Callable[[int], None] = _nothing,
                 on_file: Callable[[], None] = _nothing, naming: Naming = _same) -> None:
        self.client, self.source, self.destination = client, source, destination
        self.layout, self.overwrite = layout, overwrite
        self.on_bytes, self.on_file, self.naming = on_bytes, on_file, naming
        self.copied: dict[str, FileInfo] = {}
        self._reads = asyncio.Semaphore(max(1, files_in_flight))
        self._full: asyncio.Queue[list[Item] | None] = asyncio.Queue(maxsize=1)
        self._group: list[Item] = []
        self._bytes = 0

    async def add(self, f: SourceFile, data: bytes | None = None) -> None:
        """Write ``f`` (``data``: its bytes, when already read); waits while the
        groups in flight are full."""
        if self._group and (len(self._group) == GROUP_FILES
                            or self._bytes + f.size > GROUP_BYTES):
            group, self._group, self._bytes = self._group, [], 0
            await self._full.put(group)
        self._group.append((f, data))
        self._bytes += f.size

    async def close(self) -> None:
        """No more files: the last group goes, and the writers end once it is written."""
        if self._group:
            await self._full.put(self._group)
            self._group = []
        for _ in range(GROUPS_IN_FLIGHT):
            await self._full.put(None)

    async def run(self) -> None:
        """Write the groups as they fill, until :meth:`close`."""
        async def writer() -> None:
            while (group := await self._full.get()) is not None:
                await self._write(group)

        await gather_or_cancel(writer() for _ in range(GROUPS_IN_FLIGHT))

    async def _read(self, f: SourceFile, data: bytes | None) -> bytes:
        if data is None:
            try:
                async with self._reads:
                    data = await self.source.read_listed(f.path, f.size, f.etag)
            except StagerError as exc:
                raise self.naming(exc, f) from exc
        self.on_bytes(len(data))
        return data

    async def _write(self, group: list[Item]) -> None:
        data = await gather_or_cancel(self._read(f, d) for f, d in group)
        results = await self.client.write_many(
            [(self.destination(f), d, f.mtime) for (f, _), d in zip(group, data, strict=True)],
            layout=self.layout, overwrite=self.overwrite)
        for (f, _), result in zip(group, results, strict=True):
            if isinstance(result, StagerError):
                raise self.naming(result, f)
            self.copied[f.rel] = result
            self.on_file()
