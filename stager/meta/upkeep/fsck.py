"""fsck: the namespace against the chunks the data servers really hold.

Each up target lists its chunk files (the ``list_chunks`` route, streamed).  The
namespace is read before and after the listings; a chunk copy is

* **missing** when a file committed in both reads, with the same layout,
  places it on a listed target that lacks it (a file committed or deleted
  while the listings ran is not judged: no false alarms);
* an **orphan** when nothing in the second read refers to it: no committed
  file's layout, no pending upload, no file awaiting garbage collection, no
  rebuild in progress places it there.

With ``repair``, missing copies are copied from a replica (:mod:`.repair`)
and orphans are deleted once they have been seen orphaned for
``orphan_grace`` seconds by earlier runs.  That grace covers a write whose PUT
arrived after its upload was abandoned and a reader still holding a layout a
rebuild has since replaced.  The metadata server runs a repairing fsck every
``fsck_interval`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from ...dataplane import DataPlane
from ...dataplane.admin import delete_chunk, list_chunks
from ...errors import StagerError
from ...layout import chunk_targets
from ...protocol.cluster import FsckResult
from ...protocol.models import Layout, chunk_id
from ..service import GONE_STATES, MetaService
from ..store.base import StoredFile, all_files
from ..store.multipart import multipart_files
from .rebuild import Rebuilder
from .repair import Repairer

log = logging.getLogger("stager.fsck")
MAX_LISTED = 100
Placement = tuple[str, str]          # (target, chunk)


def placements(file_id: str, layout: Layout, size: int) -> Iterable[Placement]:
    for index in range(layout.chunk_count(size)):
        name = chunk_id(file_id, index)
        for target in chunk_targets(layout, index):
            yield target, name


def _upload_placements(file_id: str, layout: Layout) -> Iterable[Placement]:
    """Where a pending upload (size not known yet) may have put chunks: any index
    already listed on any of its targets counts, so check by file id."""
    for target in set(layout.targets):
        yield target, file_id


class Fsck:
    def __init__(self, service: MetaService, rebuilder: Rebuilder, repairer: Repairer,
                 plane: Callable[[], DataPlane]) -> None:
        self.service = service
        self.store = service.store
        self.rebuilder = rebuilder
        self.repairer = repairer
        self.plane = plane
        self.first_seen: dict[Placement, float] = {}
        self.last: dict[str, Any] | None = None
        self._lock = asyncio.Lock()

    async def run(self, repair: bool = False) -> FsckResult:
        async with self._lock:
            start = time.monotonic()
            before = await self._committed()
            listings, unreachable = await self._listings()
            after = await self._committed()
            referenced, by_upload = await self._referenced(after)
            # set work proportional to the namespace: off the event loop
            result = await asyncio.to_thread(self._compare, before, after, listings,
                                             referenced, by_upload)
            result["unreachable"] = unreachable
            lost = {t.id for t in self.service.targets.values() if t.state in GONE_STATES}
            result["under_replicated"] = sum(
                1 for f in after.values() if lost & set(f.layout.targets))
            result["repaired"] = result["orphans_deleted"] = 0
            if repair:
                await self._repair(result)
            left = result["missing"] - result["repaired"]
            result["clean"] = left == 0 and not unreachable and not result["under_replicated"]
            result["seconds"] = round(time.monotonic() - start, 3)
            summary = {k: v for k, v in result.items() if k not in ("missing_list", "orphan_list")}
            self.last = {**summary, "finished": time.time()}
            result["missing_list"] = result["missing_list"][:MAX_LISTED]
            result["orphan_list"] = result["orphan_list"][:MAX_LISTED]
            for m in result["missing_list"]:
                m["path"] = await self.store.path_of_file(m["file_id"])
            return FsckResult(**result)

    async def _committed(self) -> dict[str, StoredFile]:
        return {f.file_id: f async for f in all_files(self.store)}

    async def _listings(self) -> tuple[dict[str, set[str]], list[str]]:
        targets = self.service.healthy_targets()

        async def one(t_id: str, url: str) -> set[str]:
            return {c.name async for c in list_chunks(self.plane(), t_id, url)}

        results = await asyncio.gather(*(one(t.id, t.url) for t in targets),
                                       return_exceptions=True)
        listings: dict[str, set[str]] = {}
        unreachable = []
        for t, got in zip(targets, results, strict=True):
            if isinstance(got, BaseException):
                if not isinstance(got, StagerError | OSError):
                    raise got
                log.warning("fsck: target %s could not be listed: %s", t.id, got)
                unreachable.append(t.id)
            else:
                listings[t.id] = got
        down = [t.id for t in self.service.targets.values() if t.state == "down"]
        return listings, sorted(unreachable + down)

    async def _referenced(self, committed: dict[str, StoredFile]
                          ) -> tuple[set[Placement], set[Placement]]:
        """Chunk copies something refers to, and (target, file id) of pending work
        (uploads, garbage) whose chunks are all referenced whatever their index."""
        pending = [(file_id, layout, committed[file_id].size)
                   for file_id, layout in self.rebuilder.pending.items() if file_id in committed]

        def collect() -> set[Placement]:
            out = {p for f in committed.values() for p in placements(f.file_id, f.layout, f.size)}
            for file_id, layout, size in pending:
                out.update(placements(file_id, layout, size))
            return out

        referenced = await asyncio.to_thread(collect)
        uploads = await self.store.expired_uploads(float("inf"))
        garbage = await self.store.take_garbage(1 << 62)
        by_file = {p for u in uploads for p in _upload_placements(u.file_id, u.layout)}
        by_file.update(p for g in garbage for p in _upload_placements(g.file_id, g.layout))
        # S3 multipart uploads in progress: their hidden parts are no upload of their own
        by_file.update(p for file_id, layout in await multipart_files(self.store)
                       for p in _upload_placements(file_id, layout))
        return referenced, by_file

    def _compare(self, before: dict[str, StoredFile], after: dict[str, StoredFile],
                 listings: dict[str, set[str]], referenced: set[Placement],
                 by_file: set[Placement]) -> dict[str, Any]:
        missing = []
        expected = 0
        for file_id, f in after.items():
            old = before.get(file_id)
            if old is None or old.layout != f.layout or f.layout.cached:
                continue        # a cached file's missing chunks are not filled: not lost
            for target, name in placements(file_id, f.layout, f.size):
                if target in listings:
                    expected += 1
                    if name not in listings[target]:
                        missing.append({"file_id": file_id, "chunk": name, "target": target})
        orphans = [(target, name) for target, names in listings.items() for name in names
                   if (target, name) not in referenced
                   and (target, name.split(".", 1)[0]) not in by_file]
        now = time.monotonic()
        self.first_seen = {o: self.first_seen.get(o, now) for o in orphans}
        return {"files": len(after), "chunks_expected": expected,
                "chunks_found": sum(len(n) for n in listings.values()),
                "missing": len(missing), "missing_list": missing,
                "orphans": len(orphans),
                "orphan_list": [{"target": t, "chunk": c} for t, c in orphans]}

    async def _repair(self, result: dict[str, Any]) -> None:
        for m in result["missing_list"]:
            if await self.repairer.repair(m["target"], m["chunk"]) == "repaired":
                result["repaired"] += 1
        grace = self.service.config.orphan_grace
        now = time.monotonic()
        for o in result["orphan_list"]:
            key = (o["target"], o["chunk"])
            target = self.service.targets.get(o["target"])
            if target is None or not target.up or now - self.first_seen.get(key, now) < grace:
                continue
            try:
                if await delete_chunk(self.plane(), target.id, target.url, o["chunk"]):
                    result["orphans_deleted"] += 1
                self.first_seen.pop(key, None)
            except (StagerError, OSError) as exc:
                log.info("fsck: deleting orphan %s on %s failed: %s", o["chunk"], target.id, exc)

    def status(self) -> dict[str, Any] | None:
        return self.last
