"""``put`` and ``get`` between the local file system and stager: what the CLI,
``Client``/``AsyncClient`` and the ``stager://`` filesystem all call.

A put reads through :func:`~.sources.local_source`: files up to one source read
(:data:`~.copy.PART`) go in groups (:class:`~.small.SmallFiles`, as staging
writes them), larger ones through :func:`~.copy.copy_in`, each keeping its local
mtime.  A get writes through :class:`~.sinks.LocalSink`: a temporary name of its
own, fsynced, renamed into place, with the stager file's mtime.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fsspec.implementations.local import LocalFileSystem

from ...aio import gather_or_cancel
from ...protocol import paths
from ...protocol.models import FileInfo, LayoutSpec
from ...sources.source import SourceFile, ThreadSource, local_file, local_tree
from ..holder import current
from .copy import PART, copy_in, copy_out, run_pool
from .sinks import LocalSink
from .small import SmallFiles

if TYPE_CHECKING:
    from ..async_client import AsyncClient

SMALL_READS = 64          # small local files read at once
GETS_IN_FLIGHT = 8        # files of a tree copied out at once


def local_source() -> ThreadSource:
    """The local file system as a source: one thread pool per process (a ``put`` may
    read many files at once)."""
    return current().once("transfer.local-source",
                          lambda: ThreadSource("file://", LocalFileSystem(), "/"))


async def put_file(client: AsyncClient, f: SourceFile, dst: str, *,
                   layout: LayoutSpec | None, overwrite: bool = True,
                   on_bytes: Callable[[int], None] | None = None) -> FileInfo:
    """Copy the local file ``f`` to ``dst``; visible once all of it is committed."""
    return await copy_in(client, local_source(), f.path, f.size, dst, layout=layout,
                         mtime=f.mtime, overwrite=overwrite, on_bytes=on_bytes)


async def put_local(client: AsyncClient, src: Path, dst: str, *, layout: LayoutSpec | None,
                    overwrite: bool, files_in_flight: int) -> list[FileInfo]:
    """Copy the local file or tree ``src`` to ``dst``; the infos in the order of the
    sorted local paths.  ``files_in_flight``: large files copied at once."""
    if not await asyncio.to_thread(src.is_dir):
        return [await put_file(client, await asyncio.to_thread(local_file, src), dst,
                               layout=layout, overwrite=overwrite)]
    await client.mkdir(dst, exist_ok=True)
    files = await asyncio.to_thread(local_tree, src)
    large = [f for f in files if f.size > PART]
    done: dict[str, FileInfo] = {}
    small = SmallFiles(client, local_source(), lambda f: paths.join(dst, f.rel),
                       layout=layout, overwrite=overwrite, files_in_flight=SMALL_READS)

    async def list_small() -> None:
        for f in files:
            if f.size <= PART:
                await small.add(f)
        await small.close()

    async def copy_large(f: SourceFile) -> None:
        done[f.rel] = await put_file(client, f, paths.join(dst, f.rel), layout=layout,
                                     overwrite=overwrite)

    await gather_or_cancel([list_small(), small.run(),
                            run_pool(large, files_in_flight, copy_large)])
    done.update(small.copied)
    return [done[f.rel] for f in files]


async def get_local(client: AsyncClient, src: str, dst: str | os.PathLike[str]) -> int:
    """Copy the stager file or tree ``src`` to the local path ``dst``; returns bytes."""
    info = await client.stat(src, cached=False)
    if not info.is_dir:
        await copy_out(client, info, LocalSink(dst))
        return info.size
    await asyncio.to_thread(Path(dst).mkdir, parents=True, exist_ok=True)
    files = [f async for f in client.walk(src)]

    async def one(f: FileInfo) -> None:
        await copy_out(client, f, LocalSink(Path(dst, f.path[len(info.path):].lstrip("/"))))

    await run_pool(files, GETS_IN_FLIGHT, one)
    return sum(f.size for f in files)
