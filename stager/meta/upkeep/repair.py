"""Repair of single chunk copies: corrupt ones (scrub) and missing ones (fsck).

Data servers report chunks that failed verification (the ``scrub_report`` route);
each report is queued and the copy is overwritten with a good replica's bytes
(:mod:`.copier`).  A copy no file refers to any more is left to fsck's orphan
collection.  When no replica has good bytes the chunk is *unrecoverable*: it is
counted and left as it is, so readers keep getting ``CorruptChunk`` — never
wrong bytes.  ``stager scrub`` (:meth:`Repairer.scrub_cluster`) has every up
target verify all its chunks now and repairs what they found before answering.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from ...dataplane import DataPlane
from ...dataplane.admin import scrub_target
from ...errors import BadRequest, StagerError
from ...layout import chunk_length, chunk_targets
from ...protocol.cluster import ScrubResult
from ...protocol.models import parse_chunk_id
from ..service import MetaService
from .copier import ChunkCopier, Outcome

log = logging.getLogger("stager.repair")
RETRY_AFTER = 5.0            # seconds before a deferred repair is tried again
MAX_ATTEMPTS = 120           # … and how many times (10 minutes)


class Repairer:
    def __init__(self, service: MetaService, copier: ChunkCopier,
                 plane: Callable[[], DataPlane]) -> None:
        self.service = service
        self.store = service.store
        self.copier = copier
        self.plane = plane
        self.counts = {"reported": 0, "repaired": 0, "unrecoverable": 0, "deferred": 0,
                       "ignored": 0}
        self.last_scrub: dict[str, Any] | None = None
        self._queue: asyncio.Queue[tuple[str, str, int]] = asyncio.Queue()
        self._queued: set[tuple[str, str]] = set()

    # -- reports from data servers ----------------------------------------------------
    def report(self, target: str, chunks: list[str]) -> int:
        """Queue the repair of ``chunks`` on ``target``; returns how many were new."""
        if target not in self.service.targets:
            raise BadRequest(f"unknown target {target!r}", target=target)
        new = 0
        for chunk in chunks:
            parse_chunk_id(chunk)
            if (target, chunk) not in self._queued:
                self._queued.add((target, chunk))
                self._queue.put_nowait((target, chunk, 0))
                new += 1
        self.counts["reported"] += len(chunks)
        return new

    async def run(self) -> None:
        """Repair queued chunks, one at a time (the copier paces the bytes), forever."""
        loop = asyncio.get_running_loop()
        while True:
            target, chunk, attempt = await self._queue.get()
            try:
                outcome = await self.repair(target, chunk)
            except Exception:
                log.exception("repair of %s on %s failed", chunk, target)
                outcome = "deferred"
            if outcome == "deferred" and attempt + 1 < MAX_ATTEMPTS:
                loop.call_later(RETRY_AFTER, self._queue.put_nowait,
                                (target, chunk, attempt + 1))
            else:
                self._queued.discard((target, chunk))

    @property
    def pending(self) -> int:
        return len(self._queued)

    # -- one chunk copy ----------------------------------------------------------------
    async def repair(self, target: str, chunk: str) -> str:
        """Give ``target`` a good copy of ``chunk``: "repaired", "unrecoverable",
        "deferred" or "ignored" (no committed file places the chunk there)."""
        file_id, index = parse_chunk_id(chunk)
        f = await self.store.file_by_id(file_id)
        holders = chunk_targets(f.layout, index) if f is not None else []
        if f is None or target not in holders or index >= f.layout.chunk_count(f.size):
            self.counts["ignored"] += 1
            return "ignored"
        crc = f.checksums[index] if index < len(f.checksums) else None
        outcome = await self.copier.copy(
            chunk, chunk_length(f.layout.chunk_size, f.size, index), crc,
            [t for t in holders if t != target], target)
        name = {Outcome.COPIED: "repaired", Outcome.UNRECOVERABLE: "unrecoverable",
                Outcome.DEFERRED: "deferred"}[outcome]
        self.counts[name] += 1
        if outcome is Outcome.UNRECOVERABLE:
            log.error("chunk %s: no replica has good bytes; %s keeps its bad copy",
                      chunk, target)
        elif outcome is Outcome.COPIED:
            log.info("chunk %s on %s repaired from a replica", chunk, target)
        return name

    # -- stager scrub ------------------------------------------------------------------
    async def scrub_cluster(self, rate: int | None = None) -> ScrubResult:
        """Every up target verifies all its chunks now; corrupt copies are repaired."""
        start = time.monotonic()
        targets = self.service.healthy_targets()
        results = await asyncio.gather(
            *(scrub_target(self.plane(), t.id, t.url, rate) for t in targets),
            return_exceptions=True)
        summary: dict[str, Any] = {"targets": {}, "checked": 0, "bytes": 0, "corrupt": 0,
                                   "repaired": 0, "unrecoverable": 0, "deferred": 0,
                                   "ignored": 0, "unreachable": []}
        for t, result in zip(targets, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, StagerError | OSError):
                    raise result
                summary["unreachable"].append(t.id)
                summary["targets"][t.id] = {"error": str(result)}
                continue
            corrupt = list(result.get("corrupt", []))
            summary["targets"][t.id] = {k: result.get(k) for k in ("checked", "bytes",
                                                                   "corrupt", "seconds")}
            summary["checked"] += int(result.get("checked", 0))
            summary["bytes"] += int(result.get("bytes", 0))
            summary["corrupt"] += len(corrupt)
            for chunk in corrupt:
                summary[await self.repair(t.id, chunk)] += 1
        summary["seconds"] = round(time.monotonic() - start, 3)
        self.last_scrub = {k: v for k, v in summary.items() if k != "targets"}
        self.last_scrub["finished"] = time.time()
        return ScrubResult(**summary)

    def status(self) -> dict[str, Any]:
        return {**self.counts, "pending": self.pending, "last_scrub": self.last_scrub}
