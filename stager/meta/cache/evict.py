"""Keeping filled bytes under ``cache_limit``: the duty holder's eviction rounds.

Every ``cache_interval`` the duty holder (the one metadata server that collects
garbage) sums the filled bytes; past ``cache_high`` of the limit it frees down to
``cache_low`` (under ``plan`` with a live plan, down to ``cache_high`` only: see
:meth:`Evictor.floor`).  Candidates are filled chunks only: written files, staged files and
every file outside an attached directory have no chunk rows and are never touched;
a chunk of a pinned path is never a victim; a chunk handed to a reader in the last
``GRACE`` seconds is spared while another will do (its reader is on its way to it): a
fill that needs room waits for such chunks to age rather than evict them at once.

The victims are chosen by the named policy of :mod:`stager.eviction` (``cache_policy``),
fed the chunks in the order they were last used: ``lru`` takes the least recently
used, ``s3fifo`` its queues; ``plan`` takes the chunk whose next use by a registered
Loader plan is furthest away, and is ``lru`` while no plan is registered.  A victim's
row goes first (a reader asking for it from then on fetches it again), then its bytes
on every target of its layout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ...dataplane.admin import delete_chunk
from ...errors import InsufficientStorage, StagerError
from ...eviction import EVICTION, NextUse
from ...layout import chunk_targets
from ...protocol import paths
from ...protocol.models import chunk_id
from ..store.caching import CachedChunk

if TYPE_CHECKING:
    from ...dataplane import DataPlane
    from ..service import MetaService

log = logging.getLogger(__name__)
GRACE = 0.5             # seconds a chunk just handed to a reader is spared
POLL = 0.05             # seconds between looks while a fill waits for room
PAGE = 10000


class Evictor:
    def __init__(self, service: MetaService, plane: Callable[[], DataPlane],
                 next_use: Callable[[], Awaitable[NextUse | None]]) -> None:
        self.service = service
        self.store = service.store
        self.config = service.config
        self.plane = plane
        self.next_use = next_use        # from the registered plans (None: there are none)
        self.filled: int | None = None  # filled bytes, as last counted plus fills since
        self.inflight = 0               # bytes of fills reserved and not yet recorded
        self._room = asyncio.Lock()

    async def round(self) -> int:
        """One look at the filled bytes; evicts past the high watermark.  Returns the
        number of chunks evicted."""
        limit = self.config.cache_limit
        if limit <= 0:
            return 0
        async with self._room:
            self.filled = await self._filled_total()
            if self.filled <= limit * self.config.cache_high:
                return 0
            plans = await self._plans()
            return await self._free(self.filled - self.floor(limit, plans), plans)

    async def reserve(self, size: int) -> None:
        """Room for a fill of ``size`` bytes under the limit, evicting first if need be
        (a fill never takes the cache past ``cache_limit``; the rounds keep it under
        the high watermark); the fill then calls :meth:`filled_one`.
        InsufficientStorage when only pinned chunks are left."""
        limit = self.config.cache_limit
        if limit <= 0:
            return
        async with self._room:
            if self.filled is None or self.filled + self.inflight + size > limit:
                self.filled = await self._filled_total()     # other servers fill too
            wanted = self.filled + self.inflight + size
            if wanted > limit:
                plans = await self._plans()
                await self._free(wanted - self.floor(limit, plans), plans,
                                 patience=2 * GRACE)
            if self.filled + self.inflight + size > limit:
                raise InsufficientStorage(
                    f"the cache limit of {limit} bytes is taken by pinned or in-flight "
                    f"chunks ({self.filled + self.inflight} bytes): nothing can be evicted "
                    "for this fill", limit=limit, used=self.filled + self.inflight)
            self.inflight += size

    async def free_below(self, directory: str, need: int) -> int:
        """Evict at least ``need`` bytes of the filled chunks of files below
        ``directory``, by the policy, never a pinned one: the room a write there needs
        under the directory's quota, taken from its cached (re-fetchable) bytes first.
        The bytes freed (fewer than ``need`` when only pinned chunks are left)."""
        if need <= 0:
            return 0
        async with self._room:
            chunks = [c for c in await self._all_chunks() if paths.is_within(c.path, directory)]
            victims = await self._victims(chunks, need, await self._plans(),
                                          spare_recent=False)
            await self._evict(victims)
            freed = sum(c.size for c in victims)
            if self.filled is not None:
                self.filled -= freed
            return freed

    def filled_one(self, size: int, ok: bool) -> None:
        """A reserved fill ended: recorded (``ok``), or failed."""
        if self.config.cache_limit > 0:
            self.inflight -= size
            if ok and self.filled is not None:
                self.filled += size

    async def _plans(self) -> NextUse | None:
        """The registered plans' next uses, where the policy is ``plan`` (else None)."""
        return await self.next_use() if self.config.cache_policy == "plan" else None

    def floor(self, limit: int, plans: NextUse | None) -> int:
        """The filled bytes an eviction frees down to: the low watermark; under ``plan``
        with a live plan, the high one.  A chunk freed ahead of need is one a plan will
        read (the furthest, but read: a second fetch), so plan-aware eviction frees in
        smaller steps; the other policies know nothing of the future to lose."""
        return int(limit * (self.config.cache_high if plans is not None
                            else self.config.cache_low))

    async def _filled_total(self) -> int:
        return sum(u[3] for u in (await self.store.cache_usage()).values())

    async def _free(self, need: int, plans: NextUse | None, *, patience: float = 0.0) -> int:
        """Evict at least ``need`` bytes if it can be done: sparing the chunks just
        handed to readers (they are on their way to read them) for up to ``patience``
        seconds, then not; never a pinned one.  The number of chunks evicted."""
        deadline = time.monotonic() + patience
        while True:
            chunks = await self._all_chunks()
            last = time.monotonic() >= deadline
            victims = await self._victims(chunks, need, plans, spare_recent=not last)
            if last or sum(c.size for c in victims) >= need:
                break
            await asyncio.sleep(POLL)
        await self._evict(victims)
        assert self.filled is not None
        self.filled -= sum(c.size for c in victims)
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

    async def _victims(self, chunks: list[CachedChunk], need: int, plans: NextUse | None, *,
                       spare_recent: bool) -> list[CachedChunk]:
        """The chunks to drop to free ``need`` bytes, by the policy; never a pinned one,
        and with ``spare_recent`` none handed to a reader in the last ``GRACE`` seconds."""
        now = self.service.clock()
        pins = await self.store.pins(now)
        policy, next_use = self.config.cache_policy, plans
        if policy == "plan" and next_use is None:
            policy = "lru"
        spared = {(c.file_id, c.index) for c in chunks
                  if any(paths.is_within(c.path, p.path) for p in pins)
                  or (spare_recent and c.used > now - GRACE)}
        # fed in order of last use: their recency, as the policy would have seen it
        chunks = sorted(chunks, key=lambda c: (c.used, c.file_id, c.index))
        by_key = {(c.file_id, c.index): c for c in chunks}
        state = EVICTION[policy](sum(c.size for c in chunks), next_use)
        for i, c in enumerate(chunks):
            state.admit((c.file_id, c.index), c.size, i)
        return [by_key[k] for k in state.victims(need, len(chunks), spared)]

    async def _evict(self, victims: list[CachedChunk]) -> None:
        if not victims:
            return
        await self.store.evict_chunks([(c.file_id, c.index) for c in victims])
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
