"""Directory quotas and pins: what ``stager quota`` and ``stager pin`` do.

**Quotas.**  A quota caps a directory's subtree in bytes and/or files; a write that
would take any quota directory above it past a limit fails with 507
``quota_exceeded`` (:class:`~stager.errors.QuotaExceeded`, naming the directory,
the limit and the use), and nothing of it is visible: its upload stays uncommitted
and its chunks are collected like any abandoned write's.

Why the use is *kept* per quota directory, not summed per write: summing a
subtree at every commit costs the subtree's size, and a training set is millions
of files.  Instead each quota row holds its subtree's use, and every change of
the namespace adds its delta to the quotas above it **in its own transaction**
(the commit, a batch item's savepoint, a remove or recursive remove, a rename in
or out; an overwrite adds the new size less the old).  A commit pays a walk up
its parent chain joined to the small quota table: on PostgreSQL inside the one
``stager_commit`` statement, on SQLite one query (none past a cheap check when no
quota is set).  The use is exact under concurrency because the check and the
update share the transaction: SQLite runs writes one at a time, PostgreSQL runs
them SERIALIZABLE, so two commits that change one quota's use conflict and one
runs again.  Setting a quota counts its subtree once, in the same transaction.
Only a growth is refused, so a quota set below what is already there still lets
files be removed or shrunk.

**Cached bytes.**  A file of an attached directory counts its *filled* bytes only
(a chunk not fetched from the source takes no room): the store charges each fill
and refunds each eviction, detach or refresh in its transaction, and a fill that
would pass a quota is refused like a write.  Those bytes are re-fetchable, so they
go first: a fill refused frees its directory's cached bytes and is tried again
(:mod:`.cache.fill`), and before a commit that would pass a quota,
:meth:`QuotaService.make_room` has the cache evict that much from below the quota's
directory (never a pinned chunk).  The store's check stays the authority: what
eviction cannot free is refused with 507 ``quota_exceeded``.

**Pins.**  A pin marks a file or a directory's subtree as never to evict, until
unpinned or its TTL ends (by the metadata server's clock).  Pins name paths,
not files: a pinned path keeps its pin through a rewrite of the file: eviction
(:mod:`.cache.evict`), for the cache limit or for a quota, never takes a pinned chunk.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..protocol import paths
from ..protocol.quotas import Pin, Quota
from .store.base import MetaStore, Upload

LOOK = 1.0      # seconds a look that found no byte quota is trusted (set on another server)


class QuotaService:
    """Quotas and pins over a store, on the metadata server's clock."""

    def __init__(self, store: MetaStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        # Frees at least N cached bytes below a directory (the cache's
        # Evictor.free_below, set by the cache); None: nothing to evict.
        self.room: Callable[[str, int], Awaitable[int]] | None = None
        # when a look found no byte quota: commits skip the store until LOOK later
        self._none_since: float | None = None

    async def make_room(self, commits: Sequence[tuple[str, int]]) -> None:
        """Before the commits of uploads ``(file_id, bytes)``: for each byte quota they
        would pass, evict the difference from the cached bytes below its directory
        (an overwrite's old bytes are not subtracted: it may free more than needed).
        A write that still does not fit is refused by the store's commit."""
        if self.room is None or not commits:
            return
        now = time.monotonic()
        if self._none_since is not None and now - self._none_since < LOOK:
            return
        limits = [(q, q.bytes) for q in await self.list() if q.bytes is not None]
        self._none_since = None if limits else now
        total = sum(size for _, size in commits)
        if all(q.used_bytes + total <= limit for q, limit in limits):
            return      # fits whatever the paths: no read of the uploads
        uploads = await self.store.get_uploads([f for f, _ in commits])
        writes = [(u.path, size) for u, (_, size) in zip(uploads, commits, strict=True)
                  if isinstance(u, Upload)]
        for q, limit in limits:
            adding = sum(size for path, size in writes if paths.is_within(path, q.path))
            if adding and q.used_bytes + adding > limit:
                await self.room(q.path, q.used_bytes + adding - limit)

    async def set(self, path: str, *, max_bytes: int | None,
                  max_files: int | None) -> Quota:
        """Set (both ``None``: drop) the quota of directory ``path``."""
        self._none_since = None
        return await self.store.set_quota(paths.normalize(path), max_bytes=max_bytes,
                                          max_files=max_files)

    async def list(self) -> list[Quota]:
        return await self.store.list_quotas()

    async def pin(self, path: str, *, ttl: float | None) -> Pin:
        now = self.clock()
        return await self.store.pin(paths.normalize(path), now=now,
                                    expires=None if ttl is None else now + ttl)

    async def unpin(self, path: str) -> None:
        await self.store.unpin(paths.normalize(path))

    async def pins(self) -> list[Pin]:
        return await self.store.pins(self.clock())

    async def is_pinned(self, path: str) -> bool:
        return await self.store.is_pinned(path, self.clock())

    async def status_sections(self) -> dict[str, Any]:
        """The ``quotas`` and ``pins`` sections of ``stager status``."""
        return {"quotas": [q.to_json() for q in await self.list()],
                "pins": [p.to_json() for p in await self.pins()]}
