"""Rebuild: when a target is lost, copy its chunks from surviving replicas elsewhere.

A target is *lost* when it has been down longer than ``target_lost_after``;
*removed* when an operator says so (``stager target remove ID``).  Either way
its chunks must be copied elsewhere.  The state is stored, so a restarted
metadata server carries on.  A rebuild pass then visits every
committed file whose layout names a lost target:

1. pick a replacement for each lost slot (:mod:`.replan`, policy
   ``spread_by_free_space``) among the up targets, weighing each target's free
   space against what the pass has already placed there, so that the copies
   spread over the targets;
2. copy every chunk the new layout needs and the surviving copies lack, from a
   replica whose bytes match the committed CRC32C (:mod:`.copier`, rate-limited);
3. only when every copy is durable, swap the layout in one store transaction,
   compare-and-swap on the old layout (a file deleted or replaced meanwhile is
   left alone; the copies become orphans that fsck collects).

Readers holding the old layout keep working: the swap deletes nothing, the
surviving copies stay where they were.  Copies made for a layout not yet
swapped in count as referenced for fsck (:attr:`Rebuilder.pending`).

A file whose chunk has no good copy left is *unrecoverable*: its layout keeps
the lost target, so that if the target ever comes back the file reads again.
A pass that could not reach a source or destination is repeated later; once a
pass finishes with nothing deferred, the lost targets are retired: if one of
them heartbeats again it rejoins as an empty target (its old chunks are orphans).
A removed target never rejoins by itself; give the data server a fresh root
(a new target id) to add it back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ...aio import wait_for_wake
from ...config import Config
from ...errors import NotFound
from ...protocol.models import Layout, TargetInfo, chunk_id
from ..service import GONE_STATES, MetaService
from ..store.base import StoredFile, all_files
from .copier import ChunkCopier, Outcome
from .replan import NOTHING_PLACED, REPLACEMENTS, Copy, copies_needed, replica_floor

log = logging.getLogger("stager.rebuild")
PAGE = 500
FILES_IN_FLIGHT = 16
RETRY_MAX = 30.0             # seconds between passes while copies stay deferred
MAX_LISTED = 100             # unrecoverable paths kept for status


@dataclass
class Progress:
    """What ``stager status`` shows of the rebuild."""

    state: str = "idle"                      # idle | running | waiting
    lost: list[str] = field(default_factory=list)
    passes: int = 0
    files_total: int = 0
    files_done: int = 0
    files_deferred: int = 0
    files_degraded: int = 0                  # rebuilt, but fewer nodes than replicas
    bytes_total: int = 0
    bytes_remaining: int = 0
    bytes_copied: int = 0
    chunks_copied: int = 0
    unrecoverable: list[str] = field(default_factory=list)
    unrecoverable_count: int = 0
    started: float = 0.0
    finished: float = 0.0

    def to_json(self) -> dict[str, Any]:
        elapsed = (self.finished or time.time()) - self.started if self.started else 0.0
        body = dict(self.__dict__)
        body["rate"] = round(self.bytes_copied / elapsed) if elapsed > 0 else 0
        return body


class Rebuilder:
    def __init__(self, service: MetaService, copier: ChunkCopier, config: Config,
                 policy: str = "spread_by_free_space") -> None:
        self.service = service
        self.store = service.store
        self.copier = copier
        self.config = config
        self.replace = REPLACEMENTS[policy]
        self.progress = Progress()
        self.pending: dict[str, Layout] = {}     # file id → layout being copied towards
        self._copied: dict[str, int] = {}        # file id → bytes copied in this pass
        self._placed: dict[str, int] = {}        # target id → bytes this pass sent there
        self._wake = asyncio.Event()
        self._down_since: dict[str, float] = {}  # target id → when first seen down
        service.lost_at = self.lost_at

    # -- declaring targets lost ------------------------------------------------------
    async def declare_lost(self, target_id: str, reason: str, *,
                           state: str = "lost") -> TargetInfo:
        """Mark a target ``lost`` (or ``removed``) and start re-replicating its chunks."""
        target = self.service.targets.get(target_id)
        if target is None:
            raise NotFound(f"no target {target_id}", target=target_id)
        if target.state != state and target.state != "removed":
            log.warning("target %s %s (%s): re-replicating its chunks", target_id, state,
                        reason)
            target = await self.service.set_target_state(target_id, state)
        await self.service.retire(target_id)
        self._wake.set()
        return target

    async def check_timeouts(self) -> None:
        """Declare lost every target down for longer than ``target_lost_after``, counted
        from when this loop first saw it down, not from its last heartbeat: a metadata
        server that was itself stalled (a paused process, an overloaded machine) finds
        every target silent at once and marks them down, and their heartbeats, queued
        meanwhile, bring them up again within a tick, before they could be lost."""
        now = self.service.clock()
        down = [t for t in self.service.targets.values() if t.state == "down"]
        before = set(self._down_since)
        self._down_since = {t.id: self._down_since.get(t.id, now) for t in down}
        if set(self._down_since) != before:      # what the other servers show
            await self.service.share_status("lost_at", self.lost_at())
        for t in down:
            since = self._down_since[t.id]
            if now - since > self.config.target_lost_after:
                await self.declare_lost(t.id, f"down for {now - since:.0f}s")

    def lost_at(self) -> dict[str, float]:
        """When each down target is to be declared lost (its rebuild then starts):
        ``target_lost_after`` after the duty holder first saw it down.  Another
        metadata server shows what the holder last stored."""
        down = [t.id for t in self.service.targets.values() if t.state == "down"]
        if not self.service.duties_held:
            shared = self.service.shared_status.get("lost_at", {})
            return {t: float(shared[t]) for t in down if t in shared}
        now = self.service.clock()
        return {t: self._down_since.get(t, now) + self.config.target_lost_after for t in down}

    # -- the loop ----------------------------------------------------------------------
    async def run(self, tick: float) -> None:
        """Watch for lost targets and rebuild, for as long as the server runs."""
        delay = tick
        while True:
            await wait_for_wake(self._wake, delay)
            if not self.service.duties_held:     # another metadata server rebuilds
                self._down_since.clear()
                delay = tick
                continue
            try:
                self.service.refresh_health()
                await self.check_timeouts()
                if not self.service.retiring:
                    delay = tick
                    continue
                deferred = await self.rebuild_pass()
                await self.service.share_status("rebuild", self.progress.to_json())
                delay = min(max(delay * 2, 1.0), RETRY_MAX) if deferred else tick
            except Exception:
                log.exception("rebuild pass failed; will retry")
                delay = min(max(delay * 2, 1.0), RETRY_MAX)

    async def rebuild_pass(self) -> int:
        """One pass over the files on lost targets; returns the files deferred (and
        writes still open onto lost targets): more than 0 means another pass later."""
        gone = frozenset(t.id for t in self.service.targets.values()
                         if t.state in GONE_STATES)
        retiring = set(self.service.retiring)
        files = [f async for f in all_files(self.store, page=PAGE, targets=gone)]
        self._placed = {}
        p = self.progress = Progress(state="running", lost=sorted(gone),
                                     passes=self.progress.passes + 1,
                                     files_total=len(files), started=time.time())
        await self.service.share_status("rebuild", p.to_json())
        candidates = self._candidates()
        estimates = await asyncio.to_thread(
            lambda: {f.file_id: self._estimate(f, gone, candidates) for f in files})
        p.bytes_total = p.bytes_remaining = sum(estimates.values())
        queue = list(reversed(files))

        async def worker() -> None:
            while queue:
                f = queue.pop()
                outcome = await self.rebuild_file(f.file_id, gone)
                copied = self._copied.pop(f.file_id, 0)
                if outcome != "deferred":   # what the estimate had and was not copied
                    rest = estimates[f.file_id] - copied
                    p.bytes_remaining = max(0, p.bytes_remaining - max(0, rest))

        await asyncio.gather(*(worker() for _ in range(min(FILES_IN_FLIGHT, len(files)))))
        # A write begun before the target was gone may still commit onto it: the
        # next pass takes that file, so the target is not retired before.
        uploads = await self.store.expired_uploads(float("inf"))
        writing = sum(1 for u in uploads if gone & set(u.layout.targets))
        p.finished = time.time()
        p.state = "waiting" if p.files_deferred or writing else "idle"
        if p.state == "idle":
            await self.service.retired(retiring & gone)
        log.info("rebuild pass %d: %d files, %d rebuilt, %d deferred, %d unrecoverable, "
                 "%d bytes copied", p.passes, p.files_total, p.files_done, p.files_deferred,
                 p.unrecoverable_count, p.bytes_copied)
        return p.files_deferred + writing

    def _candidates(self) -> list[TargetInfo]:
        return self.service.healthy_targets()

    def _estimate(self, f: StoredFile, gone: frozenset[str],
                  candidates: list[TargetInfo]) -> int:
        new = self.replace(f.layout, f.size, gone, candidates, NOTHING_PLACED)
        if new is None:
            return 0
        return sum(c.length for c in copies_needed(f.layout, new, f.size, gone))

    # -- one file ----------------------------------------------------------------------
    async def rebuild_file(self, file_id: str, gone: frozenset[str]) -> str:
        """Re-replicate one file; "done", "skipped", "deferred" or "unrecoverable"."""
        p = self.progress
        f = await self.store.file_by_id(file_id)
        if f is None or not gone & set(f.layout.targets):
            return "skipped"             # deleted, replaced or already rebuilt
        new = self.replace(f.layout, f.size, gone, self._candidates(), self._placed)
        if new is None:
            p.files_deferred += 1        # no up target to copy to
            return "deferred"
        if f.layout.cached:
            # a cached file's chunks come from its source again: new places, no copies
            if not await self.store.replace_layout(file_id, f.layout, new):
                return "skipped"
            await self.store.evict_chunks([(file_id, i)
                                           for i in range(f.layout.chunk_count(f.size))])
            p.files_done += 1
            return "done"
        copies = copies_needed(f.layout, new, f.size, gone)
        for c in copies:                 # before the copies: the next file weighs them
            self._placed[c.dest] = self._placed.get(c.dest, 0) + c.length
        self.pending[file_id] = new
        try:
            outcomes = await asyncio.gather(*(self._copy(f, c) for c in copies))
            if all(o is Outcome.COPIED for o in outcomes):
                if not await self.store.replace_layout(file_id, f.layout, new):
                    return "skipped"
                p.files_done += 1
                if replica_floor(new, f.size) < new.replicas:
                    p.files_degraded += 1
                return "done"
        finally:
            del self.pending[file_id]
        if any(o is Outcome.DEFERRED for o in outcomes):
            p.files_deferred += 1
            return "deferred"
        await self._unrecoverable(file_id)
        return "unrecoverable"

    async def _copy(self, f: StoredFile, c: Copy) -> Outcome:
        crc = f.checksums[c.index] if c.index < len(f.checksums) else None
        outcome = await self.copier.copy(chunk_id(f.file_id, c.index), c.length, crc,
                                         c.sources, c.dest)
        if outcome is Outcome.COPIED:
            p = self.progress
            p.bytes_copied += c.length
            p.chunks_copied += 1
            p.bytes_remaining = max(0, p.bytes_remaining - c.length)
            self._copied[f.file_id] = self._copied.get(f.file_id, 0) + c.length
        return outcome

    async def _unrecoverable(self, file_id: str) -> None:
        p = self.progress
        p.unrecoverable_count += 1
        path = await self.store.path_of_file(file_id)
        log.error("file %s (%s): a chunk has no good copy left", path, file_id)
        if len(p.unrecoverable) < MAX_LISTED:
            p.unrecoverable.append(path or file_id)
