"""Keeping filled bytes under ``cache_limit``: the duty holder's eviction rounds.

Every ``cache_interval`` the duty holder (the one metadata server that collects
garbage) sums the filled bytes; past ``cache_high`` of the limit it frees down to
``cache_low``.  Candidates are filled chunks only: written files, staged files and
every file outside an attached directory have no chunk rows and are never touched;
a chunk of a pinned path is never a victim; a chunk read in the last ``GRACE``
seconds is spared while another will do (its reader may be on its way to it).

The victims are chosen by the named policy of :mod:`stager.eviction` (``cache_policy``),
fed the chunks in the order they were last used: ``lru`` takes the least recently
used, ``s3fifo`` its queues; ``plan`` takes the chunk whose next use by a registered
Loader plan is furthest away, and is ``lru`` while no plan is registered.  A victim's
row goes first (a reader asking for it from then on fetches it again), then its bytes
on every target of its layout.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...dataplane.admin import delete_chunk
from ...errors import StagerError
from ...eviction import EVICTION, NextUse
from ...layout import chunk_targets
from ...protocol import paths
from ...protocol.models import chunk_id
from ..store.base import CachedChunk

if TYPE_CHECKING:
    from ...dataplane import DataPlane
    from ..service import MetaService

log = logging.getLogger(__name__)
GRACE = 5.0             # seconds a chunk just read is spared
PAGE = 10000


class Evictor:
    def __init__(self, service: MetaService, plane: Callable[[], DataPlane]) -> None:
        self.service = service
        self.store = service.store
        self.config = service.config
        self.plane = plane
        self.next_use: Callable[[], NextUse | None] = lambda: None   # from registered plans
        self.evicted = 0                # chunks evicted by this server (for status, tests)

    async def round(self) -> int:
        """One look at the filled bytes; evicts past the high watermark.  Returns the
        number of chunks evicted."""
        limit = self.config.cache_limit
        if limit <= 0:
            return 0
        usage = await self.store.cache_usage()
        filled = sum(u[3] for u in usage.values())
        if filled <= limit * self.config.cache_high:
            return 0
        chunks = await self._all_chunks()
        victims = await self._victims(chunks, filled - int(limit * self.config.cache_low))
        await self._evict(victims)
        return len(victims)

    async def _all_chunks(self) -> list[CachedChunk]:
        out: list[CachedChunk] = []
        after: tuple[str, int] = ("", -1)
        while True:
            page = await self.store.cache_chunks(after=after, limit=PAGE)
            out += page
            if len(page) < PAGE:
                return out
            after = (page[-1].file_id, page[-1].index)

    async def _victims(self, chunks: list[CachedChunk], need: int) -> list[CachedChunk]:
        now = self.service.clock()
        pins = await self.store.pins(now)
        pinned = {(c.file_id, c.index) for c in chunks
                  if any(paths.is_within(c.path, p.path) for p in pins)}
        # fed in order of last use: their recency, as the policy would have seen it
        chunks = sorted(chunks, key=lambda c: (c.used, c.file_id, c.index))
        next_use = self.next_use()
        policy = self.config.cache_policy
        if policy == "plan" and next_use is None:
            policy = "lru"
        by_key = {(c.file_id, c.index): c for c in chunks}
        out: list[CachedChunk] = []
        for spared in (pinned | {k for k, c in by_key.items() if c.used > now - GRACE},
                       pinned):
            state = EVICTION[policy](sum(c.size for c in chunks), next_use)
            for i, c in enumerate(chunks):
                state.admit((c.file_id, c.index), c.size, i)
            out = [by_key[k] for k in state.victims(need, len(chunks), spared)]
            if sum(c.size for c in out) >= need:
                break
        return out

    async def _evict(self, victims: list[CachedChunk]) -> None:
        if not victims:
            return
        await self.store.evict_chunks([(c.file_id, c.index) for c in victims])
        self.evicted += len(victims)
        plane, targets = self.plane(), self.service.targets
        layouts = {}
        for c in victims:
            if c.file_id not in layouts:
                stored = await self.store.file_by_id(c.file_id)
                layouts[c.file_id] = stored.layout if stored is not None else None
            layout = layouts[c.file_id]
            if layout is None:
                continue            # the file went meanwhile: its chunks go with it
            for target in chunk_targets(layout, c.index):
                info = targets.get(target)
                if info is None or not info.up:
                    continue        # fsck collects the orphan once the target is back
                try:
                    await delete_chunk(plane, target, info.url, chunk_id(c.file_id, c.index))
                except StagerError as exc:
                    log.info("evicting %s.%d from %s: %s", c.file_id, c.index, target, exc)
