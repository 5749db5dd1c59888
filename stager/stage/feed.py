"""The copy phase of a staging run, fed by the listing as it goes.

Each listed file is described (its size, ETag and mtime completed where the
listing lacks them, ``small_files_in_flight`` at a time), then at once skipped
(already staged unchanged), handed to the small-file groups
(:class:`~stager.client.transfer.SmallFiles`) or queued for the large-file workers
(the largest known first).  So copying starts with the first files described,
not after the last.

Describing a plain-http file costs a request (its directory page has no
sizes).  A file the destination does not hold yet is *probed* with a ranged
GET of its first :data:`PROBE_BYTES` bytes, which for a file that small is the
whole file: its listing and its read are one request.  A file the destination
holds already (a rerun) is probed for one byte: the resume check needs its
size and ETag, not its bytes, and a large file is never read just to be
skipped.  When the previous run recorded its (strong) ETag, that probe is
conditional (``If-None-Match``): the server answers an unchanged file with a
304, without opening it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..aio import gather_or_cancel
from ..client.transfer import SmallFiles, buffers_for, copy_in, run_pool
from ..errors import SourceError, StagerError
from ..protocol.models import FileInfo
from ..sources.source import Source, source_etag, source_mtime
from . import plan
from .progress import Progress

if TYPE_CHECKING:
    from ..client import AsyncClient
    from .run import StageOptions

PROBE_BYTES = 256 << 10     # a new file up to this size is read by the probe that sizes it


@dataclass(frozen=True)
class Listed:
    """One listed file: its path in the source, relative path, listing info."""

    path: str
    rel: str
    info: dict[str, Any]


@dataclass
class Outcome:
    files: list[plan.SourceFile] = field(default_factory=list)    # every file, described
    skipped: dict[str, FileInfo] = field(default_factory=dict)    # rel → staged, unchanged
    copied: dict[str, FileInfo] = field(default_factory=dict)     # rel → staged now


class LargeFiles:
    """Files copied ``workers`` at a time as they are queued, the largest queued first."""

    def __init__(self, workers: int, copy: Callable[[plan.SourceFile], Awaitable[None]]) -> None:
        self.workers, self.copy = workers, copy
        self._heap: list[tuple[int, int, plan.SourceFile]] = []
        self._order = itertools.count()
        self._closed = False
        self._wake = asyncio.Event()

    def add(self, f: plan.SourceFile) -> None:
        heapq.heappush(self._heap, (-f.size, next(self._order), f))
        self._wake.set()

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    async def _next(self) -> plan.SourceFile | None:
        while not self._heap:
            if self._closed:
                return None
            self._wake.clear()
            await self._wake.wait()
        return heapq.heappop(self._heap)[2]

    async def run(self) -> None:
        async def worker() -> None:
            while (f := await self._next()) is not None:
                await self.copy(f)

        await gather_or_cancel(worker() for _ in range(max(1, self.workers)))


class Feed:
    """Describe, skip or copy every entry of one stage-in run."""

    def __init__(self, client: AsyncClient, source: Source, options: StageOptions,
                 progress: Progress, staged: dict[str, FileInfo],
                 recorded: dict[str, tuple[str, str]],
                 destination: Callable[[plan.SourceFile], str]) -> None:
        self.client, self.source, self.options, self.progress = (client, source, options,
                                                                 progress)
        self.staged, self.recorded, self.destination = staged, recorded, destination
        self.out = Outcome()
        self.small = SmallFiles(
            client, source, destination, layout=options.layout,
            files_in_flight=options.small_files_in_flight, on_bytes=progress.advance,
            on_file=progress.file_done, naming=self._naming)
        self.large = LargeFiles(options.large_files_in_flight, self._copy_large)
        self._buffers = buffers_for(options.large_files_in_flight, options.window,
                                    client.config.readahead_chunks)

    async def run(self, entries: list[Listed]) -> Outcome:
        async def describe_all() -> None:
            # each description may be the source request that reads a small file
            await run_pool(entries, self.options.small_files_in_flight, self._describe)
            await self.small.close()
            self.large.close()

        await gather_or_cancel([describe_all(), self.small.run(), self.large.run()])
        self.out.copied.update(self.small.copied)
        return self.out

    async def _describe(self, entry: Listed) -> None:
        have = self.staged.get(entry.rel) if self.options.resume else None
        etag = plan.etag_for(entry.rel, have, self.recorded)
        probe = 1 if have is not None else min(PROBE_BYTES, self.options.part_size)
        # A weak ETag matches If-None-Match when the bytes differ: compared here instead.
        unless = None
        if have is not None and etag is not None and not etag.startswith("W/"):
            unless = (have.size, etag)
        described = await self.source.describe(entry.path, entry.info, probe, unless)
        f = self._source_file(entry, described.info)
        if entry.info.get("size") is None:
            self.progress.add_total(f.size)     # the listing did not count it
        self.out.files.append(f)
        if have is not None and plan.unchanged(f, have, etag, self.options.layout):
            self.out.skipped[f.rel] = have
            self.progress.file_done(f.size)
        elif f.size <= self.options.part_size:
            await self.small.add(f, described.body)
        else:
            self.large.add(f)

    def _source_file(self, entry: Listed, info: dict[str, Any]) -> plan.SourceFile:
        size = info.get("size")
        if size is None:
            name = self.source.name(entry.path)
            raise SourceError(f"source {name} does not report its size", url=name)
        return plan.SourceFile(entry.path, entry.rel, int(size), source_mtime(info),
                               source_etag(info))

    async def _copy_large(self, f: plan.SourceFile) -> None:
        dst = self.destination(f)
        try:
            self.out.copied[f.rel] = await copy_in(
                self.client, self.source, f.path, f.size, dst, layout=self.options.layout,
                mtime=f.mtime, on_bytes=self.progress.advance, part=self.options.part_size,
                window=self.options.window, buffers=self._buffers, etag=f.etag)
        except StagerError as exc:
            raise self._naming(exc, f) from exc
        self.progress.file_done()

    def _naming(self, exc: StagerError, f: plan.SourceFile) -> StagerError:
        """The same error, its message naming the file (source errors name it already)."""
        src = self.source.name(f.path)
        if "url" in exc.details or src in exc.message:
            return exc
        return type(exc)(f"staging {src} to {self.destination(f)}: {exc.message}",
                         **exc.details)

