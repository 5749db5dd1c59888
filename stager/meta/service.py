"""The metadata service: namespace, layouts, uploads, targets.  Knows nothing of HTTP.

Everything persistent goes through the store (:class:`~.store.base.MetaStore`), whose
calls are coroutines; the service adds what is not stored: layout choice, the
checks of a commit, and target liveness (soft state, kept in memory).

Which targets new layouts avoid (suspect ones) follows :mod:`.suspicion`.

On a store several metadata servers share (PostgreSQL) the soft state is stored
too: heartbeats, suspects, boot ids and the targets being retired are written through, and
each server reads back what the others wrote every ``heartbeat_interval / 2``
(:mod:`.shared`); the background duties run on the one server whose store says
:meth:`~.store.servers.SharedState.hold_duties` (:attr:`MetaService.duties_held`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import replace as _with
from typing import Any

from ..config import Config
from ..errors import AlreadyExists, BadRequest, NotFound, StagerError
from ..layout import PLACEABLE
from ..protocol import paths
from ..protocol.batch import CommitItem, CreateItem, one
from ..protocol.cluster import MetaServer, Status
from ..protocol.manifest import Manifest
from ..protocol.messages import RerouteRequest
from ..protocol.models import MAX_LIST_LIMIT, FileInfo, Layout, LayoutSpec, TargetInfo
from . import reroute, snapshots, writes
from .quotas import QuotaService
from .snapshots import Snapshot, SnapshotCache
from .store.base import Listed, MetaStore, NodeEntry, Upload
from .suspicion import Probes, Suspicion, asker, incarnation
from .targettable import TargetTable
from .writes import Begun, Created, SpecHints

log = logging.getLogger("stager.meta")

# Targets whose chunks are re-replicated elsewhere (stager/meta/upkeep/rebuild.py): "lost"
# after target_lost_after seconds down, "removed" by `stager target remove`.
GONE_STATES = frozenset({"lost", "removed"})


class MetaService:
    """``store`` is public: the background duties (garbage collection, rebuild,
    repair, fsck) read and write through it too."""

    def __init__(self, store: MetaStore, config: Config,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        # Liveness is soft state: kept in memory, registration is persisted (start()).
        self.targets = TargetTable()
        # Lost targets whose chunks are still being re-replicated: they stay lost even
        # if they heartbeat again (stager/meta/upkeep/rebuild.py removes them when done).
        self.retiring: set[str] = set()
        # Targets this server could not reach a moment ago, one incarnation each, until
        # a clock time: new layouts avoid them even while they heartbeat (.suspicion).
        self.suspects: dict[str, Suspicion] = {}
        # The probes of targets writers report (stager/meta/reroute.py).
        self.probes = Probes(asker(config.ca_file), self._probed)
        # More sections of `status` (rebuild, scrub, fsck: stager/meta/upkeep/reliability.py).
        self.status_extras: list[Callable[[], dict[str, Any]]] = []
        # ... and those read from the store (attached directories: stager/meta/cache/).
        self.status_sources: list[Callable[[], Awaitable[dict[str, Any]]]] = []
        # The metadata servers of the store (stager/meta/presence.py), and when each
        # down target is to be declared lost (stager/meta/upkeep/rebuild.py), for `status`.
        self.meta_servers: Callable[[], list[MetaServer]] = list
        self.lost_at: Callable[[], dict[str, float]] = dict
        # Whether this server runs the background duties (GC, rebuild, fsck): always
        # with a store of its own; on a shared one, set by stager/meta/shared.py.
        self.duties_held = not store.shared
        # What the duty holder last stored of its work ("rebuild", "fsck"), as read
        # back by the other servers (stager/meta/shared.py).
        self.shared_status: dict[str, dict[str, Any]] = {}
        # Reads the shared state back now (stager/meta/shared.py sets it on a shared
        # store): a file whose layout names a target this server has not read yet (one
        # that registered with another server since its last read) waits for it.
        self.read_back: Callable[[Collection[str]], Awaitable[None]] | None = None
        # Resolved manifests, encoded once (stager/meta/snapshots.py).
        self.snapshots = SnapshotCache(config.manifest_cache_bytes)
        # The chunk size of each upload begun here, for its commit (stager/meta/writes.py).
        self.begun = Begun()
        # The layout spec a small PUT is planned with, per directory (writes.plan_hinted).
        self.spec_hints = SpecHints()
        # Directory quotas and pins (stager/meta/quotas.py).
        self.quotas = QuotaService(store, clock)

    async def start(self) -> None:
        """Load the registered targets, each as if it had just heartbeat; before serving."""
        now = self.clock()
        for t in await self.store.list_targets():
            self.targets[t.id] = _with(t, last_heartbeat=now)
            if t.state in GONE_STATES:
                self.retiring.add(t.id)

    def close(self) -> None:
        self.store.close()

    # -- namespace ------------------------------------------------------------------
    def info(self, entry: NodeEntry, locations: dict[str, str] | None = None) -> FileInfo:
        """What clients see of an entry: with the URL of each target its layout names
        (``locations``, when the caller has them already)."""
        if locations is None:
            locations = self.locations(entry.layout)
        return FileInfo(path=entry.path, type=entry.kind, size=entry.size, mtime=entry.mtime,
                        file_id=entry.file_id, layout=entry.layout,
                        default_layout=entry.default_layout,
                        # a cached file's chunks are checked against their fills' CRCs
                        checksums=None if entry.layout is not None and entry.layout.cached
                        else entry.checksums, locations=locations, attrs=entry.attrs)

    def locations(self, layout: Layout | None) -> dict[str, str]:
        """The URL of each target ``layout`` names (of those known)."""
        if layout is None:
            return {}
        return {t: self.targets[t].url for t in layout.targets if t in self.targets}

    async def stat(self, path: str) -> FileInfo:
        return self.info(NodeEntry(*await self.stat_row(path)))

    async def stat_row(self, path: str) -> Listed:
        """The stat of ``path`` as the store's row (the server writes its answer straight
        from it, :func:`~stager.meta.listing.wire_entries`), the targets its layout
        names known here (read back from the shared store first where one is not)."""
        row = await self.store.stat_row(paths.normalize(path))
        layout = row[5]
        if self.read_back is not None and layout is not None:
            unknown = [t for t in layout.targets if t not in self.targets]
            if unknown:
                await self.read_back(unknown)
        return row

    async def list(self, path: str, *, after: str = "", limit: int | None = None
                   ) -> tuple[list[FileInfo], str | None]:
        """:meth:`list_page` as FileInfos."""
        rows, nxt = await self.list_page(path, after=after, limit=limit)
        return [self.info(NodeEntry(*row)) for row in rows], nxt

    async def list_page(self, path: str, *, after: str = "", limit: int | None = None
                        ) -> tuple[list[Listed], str | None]:
        """One page of a directory; the second value is the ``after`` of the next page,
        None when no entry follows (one more row says so: no request for an empty page)."""
        limit = self.config.list_page_size if limit is None else limit
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise BadRequest(f"limit must be between 1 and {MAX_LIST_LIMIT}")
        rows = await self.store.list_rows(paths.normalize(path), after=after, limit=limit + 1)
        if len(rows) <= limit:
            return rows, None
        del rows[limit:]
        return rows, rows[-1][0].rsplit("/", 1)[-1]

    async def mkdir(self, path: str, *, parents: bool = False, exist_ok: bool = False,
                    layout: LayoutSpec | None = None) -> FileInfo:
        if layout is not None:
            layout.validate(self.config.max_chunk_size)
        return self.info(await self.store.mkdir(paths.normalize(path), parents=parents,
                                                exist_ok=exist_ok, now=self.clock(),
                                                layout=layout))

    async def set_layout(self, path: str, layout: LayoutSpec) -> FileInfo:
        layout.validate(self.config.max_chunk_size)
        return self.info(await self.store.set_layout(paths.normalize(path), layout))

    async def rename(self, src: str, dst: str, *, overwrite: bool = False) -> FileInfo:
        return self.info(await self.store.rename(src, dst, overwrite=overwrite,
                                                 now=self.clock()))

    async def remove(self, path: str, *, recursive: bool = False) -> int:
        return await self.store.remove(path, recursive=recursive, now=self.clock())

    # -- manifests ------------------------------------------------------------------
    async def put_manifest(self, path: str, body: dict[str, Any]) -> int:
        """Record a dataset manifest on directory ``path``; returns its file count."""
        def encode() -> tuple[int, bytes]:
            manifest = Manifest.from_json(body, paths.normalize(path))
            return len(manifest.files), zlib.compress(json.dumps(manifest.to_json()).encode(), 1)

        # A 20,000-file manifest takes a third of a second to check and pack: off the loop.
        count, blob = await asyncio.to_thread(encode)
        await self.store.put_manifest(path, blob, now=self.clock())
        return count

    async def manifest_etag(self, path: str) -> str:
        """The ETag the manifest of ``path`` resolves under now: one store query."""
        path = paths.normalize(path)
        urls = {t.id: t.url for t in self.targets.values()}
        return snapshots.etag_of(path, await self.store.manifest_version(path), urls)

    async def get_manifest(self, path: str) -> Snapshot:
        """The manifest of ``path`` resolved against the live namespace (see
        :mod:`stager.protocol.manifest`), encoded: from the cache of :mod:`.snapshots`
        while nothing it resolves against has changed."""
        path = paths.normalize(path)
        urls = {t.id: t.url for t in self.targets.values()}    # a snapshot for the thread
        etag = snapshots.etag_of(path, await self.store.manifest_version(path), urls)

        async def resolve() -> Snapshot:
            # Read after the version: a change in between makes this snapshot newer
            # than its key says, never older, and the next request misses anyway.
            blob, created = await self.store.get_manifest(path)
            live = await self.store.subtree_files(path)
            return await asyncio.to_thread(lambda: snapshots.encode(
                etag, snapshots.resolve(path, blob, created, live, urls)))

        return await self.snapshots.get(path, etag, resolve)

    # -- writes: each a batch; a single write is a batch of one (stager/meta/writes.py) --
    async def create(self, items: Sequence[CreateItem]) -> list[Created | StagerError]:
        """Begin a write of each item: its upload and a FileInfo carrying layout and
        locations, or its error in its place."""
        return await writes.create(self, items)

    async def plan_creates(self, items: Sequence[CreateItem]
                           ) -> tuple[list[Created | StagerError], list[Upload]]:
        """:meth:`create` that leaves the new uploads for the caller to record with
        :meth:`begin_uploads` (alongside its first chunk writes), before their commit."""
        return await writes.plan(self, items)

    async def begin_uploads(self, uploads: Sequence[Upload]) -> None:
        """Record uploads :meth:`plan_creates` made."""
        await writes.begin(self, uploads)

    async def commit(self, items: Sequence[CommitItem]) -> list[FileInfo | StagerError]:
        """Make each upload visible, in one transaction; failed items change nothing."""
        return await writes.commit(self, items)

    async def abort(self, file_ids: Sequence[str]) -> list[StagerError | None]:
        """Abandon each upload (its chunks are collected); ``None`` where it went."""
        return await writes.abort(self, file_ids)

    async def reroute(self, request: RerouteRequest) -> list[Created | StagerError]:
        """Chunk writes to a target failed: see :mod:`.reroute`."""
        return await reroute.reroute_many(self, request)

    # -- targets --------------------------------------------------------------------
    async def register_target(self, target: TargetInfo) -> TargetInfo:
        """Take a data server's registration.  One from a new incarnation (another boot
        id: the process restarted) drops the target's suspicion and its leave: it is
        up again at once (unless removed, or lost and still being rebuilt)."""
        for other in self.targets.values():
            if other.url == target.url and other.id != target.id and other.up:
                raise AlreadyExists(f"{target.url} is already registered as {other.id}",
                                    url=target.url, target=other.id)
        now = self.clock()
        old = self.targets.get(target.id)
        boot = incarnation(target, now)
        reborn = old is None or old.boot != boot
        if reborn:
            self.suspects.pop(target.id, None)
        target = _with(target, boot=boot, last_heartbeat=now)
        target = _with(target, state=self._contact_state(target))
        await self.store.upsert_target(target)
        self.targets[target.id] = target
        if reborn and self.store.shared:    # the others drop their suspicions of the last
            await self.store.put_state(f"boot/{target.id}", {"boot": boot})
            await self.store.put_state(f"left/{target.id}", None)
        log.info("target %s (node %s) registered at %s", target.id, target.node, target.url)
        return target

    async def heartbeat(self, target_id: str, *, capacity: int, used: int,
                        chunks: int) -> TargetInfo:
        return one(await self.heartbeats([(target_id, capacity, used, chunks)]))

    async def heartbeats(self, beats: Sequence[tuple[str, int, int, int]]
                         ) -> list[TargetInfo | StagerError]:
        """Take ``(target_id, capacity, used, chunks)`` beats, each failing alone (an
        unknown target: NotFound).  On a shared store the beats taken go to it in one
        write (a data server's batch: one round trip, not one per target)."""
        out: list[TargetInfo | StagerError] = []
        for target_id, capacity, used, chunks in beats:
            old = self.targets.get(target_id)
            if old is None:
                out.append(NotFound(f"target {target_id} is not registered", target=target_id))
                continue
            target = _with(old, capacity=capacity, used=used, chunks=chunks,
                           state=self._contact_state(old), last_heartbeat=self.clock())
            self.targets[target_id] = target
            out.append(target)
            if target.state != old.state:
                log.info("target %s is %s again", target_id, target.state)
                if not self.store.shared:
                    try:
                        await self.store.upsert_target(target)
                    except StagerError as exc:
                        out[-1] = exc
        taken = [t for t in out if isinstance(t, TargetInfo)]
        if self.store.shared and taken:     # the other servers read their liveness back
            try:
                await self.store.touch_targets(taken)
            except StagerError as exc:
                out = [exc if isinstance(t, TargetInfo) else t for t in out]
        return out

    async def leave(self, target_id: str) -> TargetInfo:
        """A data server is stopping: its target is down now, not ``target_timeout``
        later (no new layouts name it); a heartbeat brings it up again."""
        old = self.targets.get(target_id)
        if old is None:
            raise NotFound(f"target {target_id} is not registered", target=target_id)
        if old.state in GONE_STATES:
            return old
        target = _with(old, state="down")
        self.targets[target_id] = target
        if self.store.shared:       # the others judge it down until a later heartbeat
            await self.store.put_state(f"left/{target_id}", {"at": self.clock()})
        log.info("target %s (node %s) is leaving: marked down", target_id, target.node)
        return target

    async def forget_target(self, target_id: str) -> TargetInfo:
        """Drop a lost or removed target whose chunks are all copied elsewhere: it
        leaves the listing, its capacity stops counting, and nothing names it again.
        A target that is up, down (it may come back with the only copies) or still
        being rebuilt is refused."""
        target = self.targets.get(target_id)
        if target is None:
            raise NotFound(f"target {target_id} is not registered", target=target_id)
        if target.state not in GONE_STATES or target_id in self.retiring:
            doing = "being rebuilt" if target.state in GONE_STATES else target.state
            raise AlreadyExists(f"target {target_id} is {doing}: only a lost or removed "
                                "target whose chunks are all copied elsewhere is forgotten "
                                "(`stager target remove` it and wait for the rebuild)",
                                target=target_id, state=target.state)
        await self.store.forget_target(target_id)
        self.targets.pop(target_id, None)
        self.suspects.pop(target_id, None)
        if self.store.shared:
            await self.store.put_state(f"boot/{target_id}", None)
        log.info("target %s (node %s) forgotten", target_id, target.node)
        return target

    async def set_target_state(self, target_id: str, state: str) -> TargetInfo:
        """Store and apply a target's new state (``lost`` or ``removed``: rebuild)."""
        target = _with(self.targets[target_id], state=state)
        await self.store.upsert_target(target)
        self.targets[target_id] = target
        return target

    def _contact_state(self, target: TargetInfo) -> str:
        """The state of a target that just registered or heartbeat (as ``target``):
        up, unless an operator removed it, or it was lost and its chunks are still
        being copied elsewhere (a lost target rejoins, empty, once that is done), or
        this server could not reach this incarnation of it a moment ago (suspect)."""
        old = self.targets.get(target.id)
        if old is not None and old.state == "removed":
            return "removed"
        if target.id in self.retiring:
            return "lost"
        suspicion = self.suspects.get(target.id)
        held = suspicion is not None and suspicion.holds(target, self.clock())
        return "suspect" if held else "up"

    def is_suspect(self, target_id: str) -> bool:
        """Whether new layouts avoid ``target_id`` (see :mod:`.suspicion`)."""
        target = self.targets.get(target_id)
        return target is not None and self._contact_state(target) == "suspect"

    def suspect(self, target_id: str, reason: str, *, boot: str | None = None) -> None:
        """This server could not reach ``target_id`` (incarnation ``boot``, by default
        the one registered now): new layouts avoid it for ``target_timeout`` seconds
        (it is marked down if it also stops heartbeating; it is up again after that if
        it heartbeats, or at once when a new incarnation registers)."""
        target = self.targets.get(target_id)
        if target is None or (boot is not None and boot != target.boot):
            return              # restarted since: the new process is not suspect
        if target.state == "up":
            log.warning("target %s suspect: %s", target_id, reason)
            self.targets[target_id] = _with(target, state="suspect")
        now = self.clock()
        self.suspects[target_id] = Suspicion(now + self.config.target_timeout, target.boot,
                                             now)

    async def share_suspect(self, target_id: str) -> None:
        """Store that ``target_id`` is suspect, for the other metadata servers."""
        suspicion = self.suspects.get(target_id)
        if self.store.shared and suspicion is not None:
            await self.store.put_state(f"suspect/{target_id}", suspicion.to_json())

    async def check_report(self, target_id: str) -> bool:
        """A writer could not store chunks on ``target_id``: whether it answers this
        server's probe (one in flight per target; a target that does not answer turns
        suspect, for every server).  ``False`` for a target not up or suspect."""
        target = self.targets.get(target_id)
        if target is None or target.state not in PLACEABLE:
            return False
        return await self.probes.answers(target)

    async def _probed(self, target: TargetInfo, answered: bool) -> None:
        if not answered:
            self.suspect(target.id, "a writer could not store chunks there, and it does "
                         "not answer its health probe", boot=target.boot)
            await self.share_suspect(target.id)

    async def retire(self, target_id: str) -> None:
        """A lost target's chunks are to be copied elsewhere: it stays lost until
        :meth:`retired` (stored, on a shared store, for the other servers)."""
        self.retiring.add(target_id)
        if self.store.shared:
            await self.store.put_state(f"retiring/{target_id}", {})

    async def retired(self, target_ids: set[str]) -> None:
        """The chunks of ``target_ids`` are copied: they may rejoin, empty."""
        self.retiring.difference_update(target_ids)
        if self.store.shared:
            for target_id in sorted(target_ids):
                await self.store.put_state(f"retiring/{target_id}", None)

    async def share_status(self, section: str, body: dict[str, Any] | None) -> None:
        """Store a section of ``status`` (rebuild, fsck) that only the duty holder
        computes, for the other servers to show."""
        if self.store.shared and body is not None:
            await self.store.put_state(f"status/{section}", body)

    def refresh_health(self) -> None:
        """Mark targets that missed their heartbeats down; suspects whose time is up
        and that still heartbeat, up."""
        now = self.clock()
        if not self.suspects and not self.targets.may_be_stale(now, self.config.target_timeout):
            return
        for t in list(self.targets.values()):
            stale = now - t.last_heartbeat > self.config.target_timeout
            if stale and t.state in PLACEABLE:
                log.warning("target %s missed heartbeats for %.1fs: marked down", t.id,
                            now - t.last_heartbeat)
                self.targets[t.id] = _with(t, state="down")
            elif t.state == "suspect" and not self.is_suspect(t.id):
                self.targets[t.id] = _with(t, state="up")
        self.targets.scanned()
        for target_id in list(self.suspects):
            if not self.is_suspect(target_id):
                del self.suspects[target_id]

    def list_targets(self) -> list[TargetInfo]:
        self.refresh_health()
        return sorted(self.targets.values(), key=lambda t: t.id)

    def healthy_targets(self) -> list[TargetInfo]:
        return [t for t in self.list_targets() if t.up]

    def placeable_targets(self) -> list[TargetInfo]:
        """The targets a new layout may name: up ones, and suspect ones that have
        heartbeat since they were suspected (taken only where too few are up:
        :func:`choose_layout`)."""
        def alive(t: TargetInfo) -> bool:
            suspicion = self.suspects.get(t.id)
            return t.up or (suspicion is not None and suspicion.heard_since(t))

        return [t for t in self.list_targets() if t.state in PLACEABLE and alive(t)]

    async def status(self) -> Status:
        targets = self.list_targets()
        files, dirs, size = await self.store.counts()
        return Status(
            targets=tuple(targets),
            nodes=len({t.node for t in targets}),
            targets_up=sum(t.up for t in targets),
            capacity=sum(t.capacity for t in targets),
            used=sum(t.used for t in targets),
            files=files,
            directories=dirs,
            bytes=size,
            sections={**{k: v for extra in self.status_extras for k, v in extra().items()},
                      **await self.quotas.status_sections(),
                      **{k: v for extra in self.status_sources for k, v in
                         (await extra()).items()}},
            metas=tuple(self.meta_servers()),
            lost_at=self.lost_at(),
        )
