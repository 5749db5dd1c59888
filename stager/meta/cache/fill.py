"""Fills: the chunks of cached files fetched from their source, once each.

A reader about to read chunks of a cached file asks for them here (route ``fill``,
one request per read plan), unless it learnt their CRC32Cs from an earlier fill: then
it reads them straight from the data servers, asks here only on a miss, and reports
those reads in bulk afterwards (route ``cache_reads``: :meth:`Filler.count_reads`).
A filled chunk answers its CRC32C from the store at once, and counts as a hit.  A
missing one is fetched by exactly one metadata server:

- on this server, concurrent asks for one chunk share one task (``_flights``);
- across servers sharing a store, the task first takes the chunk's lease in the
  store (:meth:`~stager.meta.store.base.Caching.take_fill`); a server that finds
  it leased waits for the row to be filled (or the lease to run out: its holder
  died, and the chunk is taken over).

The holder reads the chunk's byte range from the source, checks that the file is
still the version listed (else the bytes might mix two versions), writes it to every target
the layout names for it (as a write from this server, with its own capability),
and records it filled; at least one copy must be stored.  A fill's bytes count
against the quotas above its file: a fill a quota refuses frees that directory's
cached bytes (:meth:`Evictor.free_below`) and is recorded once more.  A source that fails
fails the fill of that file only, as a :class:`~stager.errors.SourceError` (502)
naming the source file; other files, and chunks already filled, read on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from ...aio import gather_or_cancel
from ...checksum import crc32c
from ...errors import (
    Forbidden,
    NotFound,
    QuotaExceeded,
    SourceError,
    StagerError,
    TargetUnavailable,
)
from ...layout import chunk_length, chunk_targets
from ...protocol.batch import check_count
from ...protocol.cache import Filled, FillItem
from ...protocol.models import chunk_id
from ..store.base import StoredFile
from ..store.caching import AttachmentRecord, CachedFile
from .attach import version_of
from .evict import GRACE

if TYPE_CHECKING:
    from ...dataplane import DataPlane
    from ...sources.source import Source
    from ..service import MetaService
    from .evict import Evictor
    from .sources import Sources

log = logging.getLogger(__name__)
LEASE = 60.0            # seconds a fill may take before another server takes it over
POLL = 0.05             # seconds between looks at a chunk another server fills

Key = tuple[str, int]
Records = Callable[[str], Awaitable[AttachmentRecord]]   # an attachment by its path


class Filler:
    def __init__(self, service: MetaService, sources: Sources, plane: Callable[[], DataPlane],
                 room: Evictor, *, holder: str, concurrency: int = 16) -> None:
        self.service = service
        self.store = service.store
        self.sources = sources
        self.plane = plane
        self.room = room                # keeps filled bytes under cache_limit
        self.holder = holder
        self.limit = asyncio.Semaphore(concurrency)
        self._flights: dict[Key, asyncio.Task[int]] = {}

    async def fill(self, items: Sequence[FillItem], may_read: Callable[[str], bool], *,
                   touch: bool = True, count: bool = True) -> list[Filled | StagerError]:
        """Each item's CRC32Cs, its chunks filled first where missing; or its error.
        ``touch``: the chunks count as used now (not for the plans' prefetch);
        ``count``: they count as hits and misses (a reader's, not a warm's)."""
        check_count(len(items))
        found = await self.store.find_cached(list({i.file_id for i in items}))
        for cached in found.values():       # every path the body names, before acting
            if not may_read(cached.path):
                raise Forbidden(f"this token may not read {cached.path}", path=cached.path)
        record = self._records()
        answers = await gather_or_cancel([self._item(i, found.get(i.file_id), record)
                                          for i in items])
        hits: list[Key] = []
        counts: dict[str, tuple[int, int]] = {}
        for item, (answer, missed) in zip(items, answers, strict=True):
            if isinstance(answer, StagerError):
                continue
            cached = found[item.file_id]
            h, m = counts.get(cached.attachment, (0, 0))
            counts[cached.attachment] = (h + len(item.chunks) - len(missed), m + len(missed))
            hits += [(item.file_id, c) for c in item.chunks if c not in missed]
        if touch and (hits or counts):
            await self.store.touch_chunks(hits, self.service.clock(), counts if count else {})
        return [answer for answer, _ in answers]

    async def count_reads(self, items: Sequence[FillItem], may_read: Callable[[str], bool]
                          ) -> int:
        """Reads of chunks a client read straight from the data servers (it had their
        CRC32Cs from an earlier fill), reported in bulk after the fact: each counts as a
        hit of its attachment and marks its chunk used (a chunk evicted since is not
        marked), though not within the last ``GRACE`` seconds, so that eviction does not
        spare it as a chunk on its way to a reader (under ``plan``, a chunk read in this
        epoch is the best victim).  Fetches nothing.  The chunks counted (those of files
        still cached)."""
        check_count(len(items))
        found = await self.store.find_cached(list({i.file_id for i in items}))
        for cached in found.values():
            if not may_read(cached.path):
                raise Forbidden(f"this token may not read {cached.path}", path=cached.path)
        hits: list[Key] = []
        counts: dict[str, tuple[int, int]] = {}
        for item in items:
            cached = found.get(item.file_id)
            if cached is None:
                continue                # detached, or refreshed: nothing to count
            hits += [(item.file_id, c) for c in item.chunks]
            h, _ = counts.get(cached.attachment, (0, 0))
            counts[cached.attachment] = (h + len(item.chunks), 0)
        if hits:
            # used GRACE ago: as recent as the read for LRU's order, but not a chunk
            # "just handed to a reader" that eviction spares: its reader is done with it
            await self.store.touch_chunks(hits, self.service.clock() - GRACE, counts)
        return len(hits)

    async def _item(self, item: FillItem, cached: CachedFile | None, record: Records
                    ) -> tuple[Filled | StagerError, set[int]]:
        """One file's chunks: (its answer, the chunks that were missing)."""
        try:
            if cached is None:
                raise NotFound(f"file {item.file_id} is not a file of an attached directory "
                               "(detached, or changed at its source and refreshed)",
                               file_id=item.file_id)
            filled = await self.store.filled_chunks(item.file_id, item.chunks)
            again = set(item.again)
            missing = {c for c in item.chunks if c not in filled or c in again}
            if again:
                await self.store.evict_chunks([(item.file_id, c) for c in again])
            got = await gather_or_cancel([self._chunk(cached, c, record) for c in sorted(missing)])
            filled.update(zip(sorted(missing), got, strict=True))
            return Filled(tuple(filled[c] for c in item.chunks), tuple(sorted(missing))), missing
        except StagerError as exc:
            return exc, set()

    async def _chunk(self, cached: CachedFile, index: int, record: Records) -> int:
        """Chunk ``index`` filled (by one task however many ask): its CRC32C."""
        key = (cached.file_id, index)
        task = self._flights.get(key)
        if task is None:
            task = self._flights[key] = asyncio.ensure_future(self._fill_one(cached, index,
                                                                                record))
            task.add_done_callback(lambda t: self._landed(key, t))
        return await asyncio.shield(task)

    def _landed(self, key: Key, task: asyncio.Task[int]) -> None:
        self._flights.pop(key, None)
        if not task.cancelled():
            task.exception()    # retrieved: its waiters may all have gone (a shutdown)

    async def close(self) -> None:
        """Stop the fills under way (at shutdown, before the sources close)."""
        tasks = list(self._flights.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _fill_one(self, cached: CachedFile, index: int, record: Records) -> int:
        store, file_id = self.store, cached.file_id
        while True:
            now = self.service.clock()
            if await store.take_fill(file_id, index, self.holder, until=now + LEASE, now=now):
                break
            filled = await store.filled_chunks(file_id, [index])
            if index in filled:
                return filled[index]
            await asyncio.sleep(POLL)
        try:
            size, crc = await self._fetch_and_store(cached, index, record)
        except BaseException:
            await asyncio.shield(store.release_fill(file_id, index, self.holder))
            raise
        ok = True
        try:
            recorded = await self._record(cached, index, size, crc)
        except QuotaExceeded:
            # over a quota even with its directory's cache freed: not kept (the reader
            # gets the 507), its copies go rather than linger unrecorded
            ok = False
            await asyncio.shield(self._unfill(cached, index))
            raise
        finally:
            self.room.filled_one(size, ok=ok)
        if not recorded:
            raise NotFound(f"{cached.path} changed or was detached while filling",
                           path=cached.path)
        return crc

    async def _record(self, cached: CachedFile, index: int, size: int, crc: int) -> bool:
        """Record chunk ``index`` filled.  Its bytes count against the quotas above
        the file: one that would pass a quota first frees that directory's cached
        bytes (by the policy, never a pinned one) and is recorded then, or refused."""
        for retry in (False, True):
            try:
                return await self.store.record_fill(cached.file_id, index, size=size,
                                                    crc=crc, now=self.service.clock())
            except QuotaExceeded as exc:
                if retry or exc.details.get("resource") != "bytes":
                    raise
                d = exc.details
                await self.room.free_below(d["directory"], d["use"] + size - d["limit"])
        raise AssertionError("unreachable")

    async def _unfill(self, cached: CachedFile, index: int) -> None:
        """A fill not recorded: its lease and its stored copies go."""
        await self.store.release_fill(cached.file_id, index, self.holder)
        stored = await self.store.file_by_id(cached.file_id)
        if stored is not None:
            await self.room.delete_copies(stored.layout, cached.file_id, index)

    async def _fetch_and_store(self, cached: CachedFile, index: int, record: Records
                               ) -> tuple[int, int]:
        """Read chunk ``index`` of ``cached`` from its source and store every copy."""
        stored = await self._file(cached.file_id)
        layout = stored.layout
        start = index * layout.chunk_size
        length = chunk_length(layout.chunk_size, stored.size, index)
        if length <= 0:
            raise NotFound(f"{cached.path} has no chunk {index}", path=cached.path)
        source = await self.sources.open(await record(cached.attachment))
        reserved = False
        try:
            async with self.limit:
                # room is reserved for the bytes about to arrive, not for every fill
                # queued behind the limit (that would evict ahead of need)
                await self.room.reserve(length)
                reserved = True
                data = await self._read(cached, source, start, length, stored)
            crc = crc32c(data)
            await self._store_copies(chunk_id(cached.file_id, index),
                                     chunk_targets(layout, index), data, crc)
            return length, crc
        except BaseException:
            if reserved:
                self.room.filled_one(length, ok=False)
            raise

    async def _read(self, cached: CachedFile, source: Source, start: int, length: int,
                    stored: StoredFile) -> bytes:
        """The chunk's bytes from the source, of the version listed (else SourceError)."""
        etag = cached.version[len("etag:"):] if cached.version.startswith("etag:") else None
        data, proven = await source.read_as_listed(cached.key, start, length, etag=etag,
                                                   size=stored.size)
        # the file must still be the version listed, else these bytes may be of another
        # version than the chunks filled before: never mixed (a raw HTTP read's answer
        # names its ETag and size; other sources are asked again)
        now = cached.version if proven else version_of(await source.info(cached.key))
        if len(data) != length or now != cached.version:
            raise SourceError(f"source {source.name(cached.key)} changed since it was listed "
                              f"({len(data)} bytes at {start}, {length} expected); run: "
                              f"stager attach --refresh {cached.attachment}",
                              url=source.name(cached.key), path=cached.path)
        return data

    async def _store_copies(self, chunk: str, targets: list[str], data: bytes,
                            crc: int) -> None:
        """Write the chunk to each of its targets; at least one must take it.  Targets
        this server believes down are tried only when no other took the chunk: its view
        of presence (heartbeats read from the shared store) can lag behind a live data
        server, and a fill refused for that alone would fail a reader for nothing."""
        plane, known = self.plane(), dict(self.service.targets)
        unknown = [t for t in targets if t not in known]
        if unknown:     # registered through another metadata server since this one read
            known.update({t.id: t for t in await self.store.list_targets() if t.id in unknown})

        async def put(target: str) -> StagerError | None:
            info = known.get(target)
            if info is None:
                return TargetUnavailable(f"target {target} is unknown", target=target)
            try:
                await plane.put_chunk(target, info.url, chunk, data, crc)
            except StagerError as exc:
                return exc
            return None

        up = [t for t in targets if t in known and known[t].up]
        errors = dict(zip(up, await asyncio.gather(*(put(t) for t in up)), strict=True))
        if all(e is not None for e in errors.values()):
            rest = [t for t in targets if t not in errors]
            errors.update(zip(rest, await asyncio.gather(*(put(t) for t in rest)),
                              strict=True))
        if all(e is not None for e in errors.values()):
            first = next((e for e in errors.values() if e is not None), "no targets")
            raise TargetUnavailable(f"no target of chunk {chunk} took it: {first}",
                                    chunk=chunk, targets=targets)
        for target, error in errors.items():
            if error is not None:
                log.info("fill of %s: copy on %s not stored: %s", chunk, target, error)

    async def _file(self, file_id: str) -> StoredFile:
        """The file's size and layout as stored now (a rebuild may have moved it)."""
        stored = await self.store.file_by_id(file_id)
        if stored is None:
            raise NotFound(f"file {file_id} is gone", file_id=file_id)
        return stored

    def _records(self) -> Records:
        """The attachment at a path, for one fill request: the store is asked once, and
        only when a chunk is missing (not once per chunk fetched)."""
        listing: asyncio.Future[list[AttachmentRecord]] | None = None

        async def record(path: str) -> AttachmentRecord:
            nonlocal listing
            if listing is None:
                listing = asyncio.ensure_future(self.store.attachments())
            for r in await asyncio.shield(listing):
                if r.path == path:
                    return r
            raise NotFound(f"{path} is no longer attached", path=path)
        return record
