"""Keeping filled bytes under ``cache_limit``: the duty holder's eviction rounds.

Every ``cache_interval`` the duty holder (the one metadata server that collects
garbage) sums the filled bytes; past ``cache_high`` of the limit it frees down to
``cache_low`` (under ``plan`` with a live plan, down to ``cache_high`` only: see
:meth:`Evictor.floor`).  Candidates are filled chunks only: written files, staged files and
every file outside an attached directory have no chunk rows and are never touched;
a chunk of a pinned path is never a victim; a chunk handed to a reader in the last
``GRACE`` seconds is spared while another will do (its reader is on its way to it): a
fill that needs room waits for such chunks to age rather than evict them at once.

The victims are chosen by the named policy of :mod:`stager.eviction` (``cache_policy``).
``lru`` and ``s3fifo`` look at the past, so the :class:`Evictor` keeps their state
between evictions: before each choice it is brought up to date with the chunk
rows (the store is the one record of fills and reads, whichever metadata server saw
them): a new row is admitted at its fill time, a row used since the last look is a
hit, a row gone is forgotten, in the order they happened.  So S3-FIFO keeps its
queues, its read counts and its ghosts of earlier evictions (a state rebuilt from the
rows at each eviction, with every chunk admitted afresh in order of last use, is
LRU under another name).  ``plan`` takes the chunk whose next use by a registered
Loader plan is furthest away (derived anew each time from the plans), and is ``lru``
while no plan is registered.  A victim's
row goes first (a reader asking for it from then on fetches it again), then its bytes
on every target of its layout.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ...dataplane.admin import delete_chunk
from ...errors import InsufficientStorage, StagerError
from ...eviction import EVICTION, Eviction, NextUse
from ...layout import chunk_targets
from ...protocol import paths
from ...protocol.models import Layout, chunk_id
from ..store.caching import CachedChunk

if TYPE_CHECKING:
    from ...dataplane import DataPlane
    from ..service import MetaService

log = logging.getLogger(__name__)
GRACE = 0.5             # seconds a chunk just handed to a reader is spared
POLL = 0.05             # seconds between looks while a fill waits for room
PAGE = 10000
LIVE = ("lru", "s3fifo")    # policies of the past: a state kept between evictions

Key = tuple[str, int]


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
        # the state of a policy of the past (LIVE) and each chunk's last use it has seen
        self._state: tuple[str, Eviction] | None = None
        self._seen: dict[Key, float] = {}
        service.quotas.room = self.free_below     # a quota's room is made from its cache

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
            victims, state = await self._victims(await self._all_chunks(), need,
                                                 await self._plans(), spare_recent=False,
                                                 within=directory)
            self._keep(state, victims)
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
            victims, state = await self._victims(chunks, need, plans, spare_recent=not last)
            if last or sum(c.size for c in victims) >= need:
                break
            await asyncio.sleep(POLL)
        self._keep(state, victims)
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
                       spare_recent: bool, within: str | None = None
                       ) -> tuple[list[CachedChunk], Eviction | None]:
        """The chunks to drop to free ``need`` bytes, by the policy; never a pinned one,
        none outside directory ``within`` (when given), and with ``spare_recent`` none
        handed to a reader in the last ``GRACE`` seconds.  Also the policy's state after
        the choice (of a LIVE policy: :meth:`_keep` it once the victims are evicted)."""
        now = self.service.clock()
        pins = await self.store.pins(now)
        policy, next_use = self.config.cache_policy, plans
        if policy == "plan" and next_use is None:
            policy = "lru"
        spared = {(c.file_id, c.index) for c in chunks
                  if any(paths.is_within(c.path, p.path) for p in pins)
                  or (spare_recent and c.used > now - GRACE)
                  or (within is not None and not paths.is_within(c.path, within))}
        by_key = {(c.file_id, c.index): c for c in chunks}
        if policy in LIVE:
            # chosen on a copy: a choice that is not acted on (a fill still waiting for
            # room) leaves the kept state as it was
            state = copy.deepcopy(self._live(policy, chunks))
            kept: Eviction | None = state
        else:
            # fed in order of last use: their recency, as the policy would have seen it
            chunks = sorted(chunks, key=lambda c: (c.used, c.file_id, c.index))
            state, kept = EVICTION[policy](sum(c.size for c in chunks), next_use), None
            for i, c in enumerate(chunks):
                state.admit((c.file_id, c.index), c.size, i)
        return [by_key[k] for k in state.victims(need, len(chunks), spared)], kept

    def _live(self, policy: str, chunks: list[CachedChunk]) -> Eviction:
        """The kept state of ``policy`` (a LIVE one), brought up to date with the chunk
        rows: what was filled, read or dropped since the last look, in time order."""
        if self._state is None or self._state[0] != policy:
            limit = self.config.cache_limit or sum(c.size for c in chunks)
            self._state, self._seen = (policy, EVICTION[policy](max(1, limit), None)), {}
        state, seen = self._state[1], self._seen
        rows = {(c.file_id, c.index): c for c in chunks}
        for key in [k for k in seen if k not in rows]:
            state.forget(key)           # evicted, refreshed or detached since
            del seen[key]
        events: list[tuple[float, int, Key, int]] = []      # (when, 0 fill / 1 read, ...)
        for key, c in rows.items():
            last = seen.get(key)
            if last is None:
                events.append((c.filled, 0, key, c.size))
                last = c.filled
            if c.used > last:
                events.append((c.used, 1, key, c.size))
            seen[key] = c.used
        for i, (_, kind, key, size) in enumerate(sorted(events)):
            if kind == 0:
                state.admit(key, size, i)
            else:
                state.hit(key, i)
        return state

    def _keep(self, state: Eviction | None, victims: list[CachedChunk]) -> None:
        """The state a LIVE policy chose ``victims`` with, kept.  The victims have left
        it, and are no longer seen: filled again, each is admitted anew (S3-FIFO finds
        its ghost), not taken for a hit of a chunk the state no longer holds."""
        if state is not None and self._state is not None:
            self._state = (self._state[0], state)
            for c in victims:
                self._seen.pop((c.file_id, c.index), None)

    async def _evict(self, victims: list[CachedChunk]) -> None:
        if not victims:
            return
        await self.store.evict_chunks([(c.file_id, c.index) for c in victims])
        layouts = {}
        for c in victims:
            if c.file_id not in layouts:
                stored = await self.store.file_by_id(c.file_id)
                layouts[c.file_id] = stored.layout if stored is not None else None
            layout = layouts[c.file_id]
            if layout is None:
                continue            # the file went meanwhile: its chunks go with it
            await self.delete_copies(layout, c.file_id, c.index)

    async def delete_copies(self, layout: Layout, file_id: str, index: int) -> None:
        """Chunk ``index`` of ``file_id`` off every target of its layout that is up."""
        plane, targets = self.plane(), self.service.targets
        for target in chunk_targets(layout, index):
            info = targets.get(target)
            if info is None or not info.up:
                continue        # fsck collects the orphan once the target is back
            try:
                await delete_chunk(plane, target, info.url, chunk_id(file_id, index))
            except StagerError as exc:
                log.info("evicting %s.%d from %s: %s", file_id, index, target, exc)
