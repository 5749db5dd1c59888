"""Staging small files in batches.

A small file (up to ``part_size``) is read from the source in one request; one
at a time, writing it would cost a create and a commit on the metadata server and
a chunk request per replica, each waiting on an fsync.  Here files go in groups
(up to :data:`stager.client.bulk.GROUP_FILES` files or `GROUP_BYTES` bytes): the group's
files are read from the source, ``files_in_flight`` at a time across all groups,
then written with one :meth:`AsyncClient.write_many` (one create batch, chunk
batches per target, one commit batch).  A few groups are in flight, so reading
one overlaps writing another.  Every file becomes visible only once committed,
whole; the first failure cancels the run, as for large files.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..aio import gather_or_cancel
from ..client.bulk import size_groups
from ..errors import SourceError, StagerError
from ..protocol.models import FileInfo, LayoutSpec
from . import plan
from .source import Source

if TYPE_CHECKING:
    from ..client import AsyncClient

GROUPS_IN_FLIGHT = 3

Naming = Callable[[StagerError, plan.SourceFile], StagerError]


async def copy_small(client: AsyncClient, source: Source, files: list[plan.SourceFile],
                     destination: Callable[[plan.SourceFile], str], *,
                     layout: LayoutSpec | None, files_in_flight: int,
                     on_bytes: Callable[[int], None], on_file: Callable[[], None],
                     naming: Naming) -> dict[str, FileInfo]:
    """Stage ``files`` (each up to one source request) at ``destination(f)``;
    returns ``rel → FileInfo`` of every file committed."""
    reads = asyncio.Semaphore(max(1, files_in_flight))
    copied: dict[str, FileInfo] = {}

    async def read(f: plan.SourceFile) -> bytes:
        try:
            async with reads:
                data = await source.read_all(f.path)
        except StagerError as exc:
            raise naming(exc, f) from exc
        if len(data) != f.size:
            raise SourceError(f"source {source.name(f.path)} changed while staging: it has "
                              f"{len(data)} bytes, listed as {f.size}",
                              url=source.name(f.path))
        on_bytes(len(data))
        return data

    async def write(group: list[plan.SourceFile]) -> None:
        data = await gather_or_cancel(read(f) for f in group)
        results = await client.write_many(
            [(destination(f), d, f.mtime) for f, d in zip(group, data, strict=True)],
            layout=layout)
        for f, result in zip(group, results, strict=True):
            if isinstance(result, StagerError):
                raise naming(result, f)
            copied[f.rel] = result
            on_file()

    pending = iter(list(size_groups(files)))

    async def worker() -> None:
        for group in pending:        # one shared iterator: each group goes to one worker
            await write(group)

    await gather_or_cancel(worker() for _ in range(GROUPS_IN_FLIGHT))
    return copied
