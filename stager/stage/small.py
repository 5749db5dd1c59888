"""Staging small files in batches, as the listing finds them.

A small file (up to ``part_size``) is read from the source in one request; one
at a time, writing it would cost a create and a commit on the metadata server and
a chunk request per replica, each waiting on an fsync.  Here files go in groups
(up to :data:`stager.client.bulk.GROUP_FILES` files or ``GROUP_BYTES`` bytes),
formed in the order files are :meth:`SmallFiles.add`-ed, so that the first
groups are written while the rest of the source is still being listed.  A file
comes with its bytes when the listing already read them (a plain-http probe
holds a whole small file); the others are read when their group is written,
``files_in_flight`` at a time across all groups.  Each group is written with
one :meth:`AsyncClient.write_many` (one create batch, chunk batches per target,
one commit batch); :data:`GROUPS_IN_FLIGHT` are written at once, one more waits
full, one fills: that bounds the bytes held.  Every file becomes visible only
once committed, whole; the first failure cancels the run, as for large files.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..aio import gather_or_cancel
from ..client.bulk import GROUP_BYTES, GROUP_FILES
from ..errors import StagerError
from ..protocol.models import FileInfo, LayoutSpec
from . import plan
from .source import Source

if TYPE_CHECKING:
    from ..client import AsyncClient

GROUPS_IN_FLIGHT = 3

Naming = Callable[[StagerError, plan.SourceFile], StagerError]
Item = tuple[plan.SourceFile, bytes | None]


class SmallFiles:
    """Small files staged in groups: :meth:`add` each, then :meth:`close`, while
    :meth:`run` writes them; ``copied`` is ``rel → FileInfo`` of every file committed."""

    def __init__(self, client: AsyncClient, source: Source,
                 destination: Callable[[plan.SourceFile], str], *,
                 layout: LayoutSpec | None, files_in_flight: int,
                 on_bytes: Callable[[int], None], on_file: Callable[[], None],
                 naming: Naming) -> None:
        self.client, self.source, self.destination = client, source, destination
        self.layout, self.on_bytes, self.on_file, self.naming = (layout, on_bytes, on_file,
                                                                 naming)
        self.copied: dict[str, FileInfo] = {}
        self._reads = asyncio.Semaphore(max(1, files_in_flight))
        self._full: asyncio.Queue[list[Item] | None] = asyncio.Queue(maxsize=1)
        self._group: list[Item] = []
        self._bytes = 0

    async def add(self, f: plan.SourceFile, data: bytes | None = None) -> None:
        """Stage ``f`` (``data``: its bytes, when already read); waits while the
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

    async def _read(self, f: plan.SourceFile, data: bytes | None) -> bytes:
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
            layout=self.layout)
        for (f, _), result in zip(group, results, strict=True):
            if isinstance(result, StagerError):
                raise self.naming(result, f)
            self.copied[f.rel] = result
            self.on_file()
