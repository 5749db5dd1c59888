"""The embedded metadata store: one SQLite file, WAL, fsync on every commit.

:class:`SQLiteStore` implements :class:`~.store.base.MetaStore` by running blocking
SQL on one thread (:mod:`.sqlite.thread`), so the event loop never waits on SQLite
or on an fsync; only a stat, a few index lookups that a WAL reader makes without
waiting for the writer, runs on the loop through a connection of its own.  The SQL
itself lives in helper objects over one connection (:mod:`.sqlite.db`): the
namespace, uploads and targets (:mod:`.sqlite.namespace`), the files as rebuild,
repair and fsck see them (:mod:`.sqlite.reliability`), and the managed cache's
attachments and filled chunks (:mod:`.sqlite.cache`).  Writes of uploads that queue
up while the thread is busy share one transaction (group commit); everything else
runs alone.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from ....errors import QuotaExceeded, StagerError
from ....protocol import paths
from ....protocol.authmsg import TokenInfo
from ....protocol.models import Layout, LayoutSpec, TargetInfo
from ....protocol.quotas import Pin, Quota
from ..base import (
    CommitArgs,
    CreateCheck,
    EntryRecord,
    Garbage,
    Listed,
    ManifestRecord,
    ManifestVersion,
    MetaStore,
    NodeEntry,
    StoredFile,
    Upload,
    committing,
    listed_of,
)
from ..caching import AttachmentRecord, CachedChunk, CachedFile
from ..spec import SpecChanged, checked_create, checked_spec
from .answers import AnswerSQL
from .cache import CacheSQL
from .copy import CopySQL
from .db import Database
from .multipart import MultipartSQL, SQLiteMultipart
from .namespace import NamespaceSQL, Placed, Row
from .reliability import ReliabilitySQL
from .s3keys import S3KeySQL, SQLiteS3Keys
from .shared import SharedSQL
from .thread import MAX_GROUP, StoreThread
from .tokens import TokenSQL

R = TypeVar("R")
LOOP_CHECKS = 8          # creates a check reads on the loop (SQLiteStore.check_creates)


class SQLiteStore(SQLiteMultipart, SQLiteS3Keys, MetaStore):
    """The store in one SQLite file at ``path``; up to ``max_group`` queued upload
    writes share one transaction (1: none do)."""

    in_order = True     # every call runs on the one store thread, in the order made

    def __init__(self, path: str | Path, *, max_group: int = MAX_GROUP) -> None:
        self.database = Database(path)
        self.path = self.database.path
        self.namespace = NamespaceSQL(self.database)
        self.reads = NamespaceSQL(self.database, self.database.reader)   # stat, on the loop
        self.files = ReliabilitySQL(self.database)
        self.tokens = TokenSQL(self.database)
        self.copies = CopySQL(self.database)
        self.states = SharedSQL(self.database)
        self.cache = CacheSQL(self.database)
        self.multipart = MultipartSQL(self.database)
        self.s3keys = S3KeySQL(self.database)

        self.answers = AnswerSQL(self.database)
        # Public: its counters say how writes were grouped (tests, benchmarks).
        self.thread = StoreThread(self.database.transaction, max_group=max_group)

    def close(self) -> None:
        self.thread.close()
        self.database.close()

    def _unflushed(self, fn: Callable[..., R], *args: Any) -> R:
        """``fn(*args)`` on the store thread; committed without an fsync when alone."""
        with self.database.unflushed():
            return fn(*args)

    # -- namespace --------------------------------------------------------------
    async def stat(self, path: str, *, checksums: bool = True) -> NodeEntry:
        entry = NodeEntry(*await self.stat_row(path))
        return entry if checksums else replace(entry, checksums=None)

    async def stat_row(self, path: str) -> Listed:
        """On the loop, through the reader connection: a point read by index in WAL
        mode never waits for a writer; where SQLite says it would (busy, or the store
        closing under it), the store thread answers in its turn.  One statement finds
        a path that is there; one that is not is walked in a read transaction, which
        says what is missing."""
        try:
            row = self.reads.found(paths.normalize(path))
            if row is not None:
                return row
            with self.database.snapshot():
                return listed_of(self.reads.stat(path))
        except (sqlite3.OperationalError, sqlite3.ProgrammingError):
            return listed_of(await self.thread.run(self.namespace.stat, path))

    async def list_rows(self, path: str, *, after: str, limit: int) -> list[Listed]:
        # On the store thread, in order with the writes queued before it (a page read
        # on the loop measured no faster, and a long one would hold the loop).
        return await self.thread.run(self.namespace.list_rows, path, after=after, limit=limit)

    async def mkdir(self, path: str, *, parents: bool, exist_ok: bool, now: float,
                    layout: LayoutSpec | None = None) -> NodeEntry:
        return await self.thread.run(self.namespace.mkdir, path, parents=parents,
                                     exist_ok=exist_ok, now=now, layout=layout)

    async def set_layout(self, path: str, layout: LayoutSpec) -> NodeEntry:
        return await self.thread.run(self.namespace.set_layout, path, layout)

    async def rename(self, src: str, dst: str, *, overwrite: bool, now: float) -> NodeEntry:
        return await self.thread.run(self.namespace.rename, src, dst, overwrite=overwrite,
                                     now=now)

    async def remove(self, path: str, *, recursive: bool, now: float) -> int:
        return await self.thread.run(self.namespace.remove, path, recursive=recursive, now=now)

    async def counts(self) -> tuple[int, int, int]:
        return await self.thread.run(self.namespace.counts)

    async def subtree_files(self, path: str) -> dict[str, NodeEntry]:
        return await self.thread.run(self.namespace.subtree_files, path)

    # -- manifests --------------------------------------------------------------
    async def put_manifest(self, path: str, body: bytes, *, now: float) -> None:
        await self.thread.run(self.namespace.put_manifest, path, body, now=now)

    async def get_manifest(self, path: str) -> tuple[bytes, float]:
        return await self.thread.run(self.namespace.get_manifest, path)

    async def manifest_version(self, path: str) -> ManifestVersion:
        return await self.thread.run(self.namespace.manifest_version, path)

    # -- writes: these may share one transaction with writes queued alongside ----
    async def check_creates(self, items: Sequence[CreateCheck]
                            ) -> list[LayoutSpec | StagerError]:
        """A few creates on the loop, through the reader connection, as :meth:`stat`: a
        few lookups by index each, which a hop to the store thread and back cost
        several times over; a larger batch, or one SQLite would make wait, on the
        store thread (a long read would hold the loop)."""
        if len(items) > LOOP_CHECKS:
            return await self.thread.run(self.namespace.check_creates, items)
        try:
            with self.database.snapshot():
                return self.reads.check_creates(items)
        except (sqlite3.OperationalError, sqlite3.ProgrammingError):
            return await self.thread.run(self.namespace.check_creates, items)

    async def begin_uploads(self, uploads: Sequence[Upload]) -> None:
        # not flushed when alone: nothing of them is visible, and their commit flushes
        # them (docs/metadata-stores.md: what a store may lose, and why that loses nothing)
        # one alone leads: a commit of it right behind it in the queue is joined to it
        lead = (uploads[0].file_id, uploads[0]) if len(uploads) == 1 else None
        await self.thread.write_as(lead, None, self._unflushed, self._begin_uploads, uploads)

    def _begin_uploads(self, uploads: Sequence[Upload]) -> None:
        """(On the store thread.)  One planned without a check, recorded alone (not
        joined to its commit: a reroute, an abort), is checked here, in the same
        transaction."""
        with self.namespace.tx():
            for upload in uploads:
                refused, _ = self._check_planned(upload)
                if refused is not None:
                    raise refused
            self.namespace.begin_uploads(uploads)

    def _check_planned(self, upload: Upload) -> tuple[StagerError | None, Placed | None]:
        """(On the store thread.)  The check of an upload planned without one (its
        ``spec`` set), where it is recorded: the error its create there raises,
        :class:`~stager.meta.store.spec.SpecChanged`, or None; and where it found the
        upload's path, for a commit in the same transaction not to walk it again (None
        where its directory is still to be made, or nothing was checked)."""
        if upload.spec is None:
            return None, None
        ns, found = self.namespace, []

        def child(parent_id: int, name: str) -> Row | None:
            found.append((parent_id, ns.child(parent_id, name)))
            return found[-1][1]

        checked = checked_create((upload.path, upload.overwrite, upload.parents),
                                 ns.parent_state(paths.split(upload.path)[0]), child)
        return checked_spec(upload, checked), found[0] if found else None

    async def get_uploads(self, file_ids: Sequence[str]) -> list[Upload | StagerError]:
        return await self.thread.run(self.namespace.get_uploads, file_ids)

    async def commit_uploads(self, items: Sequence[CommitArgs], *,
                             now: float) -> list[NodeEntry | StagerError]:
        def put(upload: Upload) -> Callable[[], list[NodeEntry | StagerError]]:
            return lambda: [self.put_upload(upload, items[0], now)]

        follow = (items[0][0], put) if len(items) == 1 else None
        return await self.thread.write_as(None, follow, self.namespace.commit_uploads, items,
                                          now=now)

    def put_upload(self, upload: Upload, item: CommitArgs, now: float
                   ) -> NodeEntry | StagerError:
        """(On the store thread.)  The record of ``upload`` and its commit ``item``, as
        one, the way PostgreSQL's ``stager_put`` does it: the upload's row is written
        only where the commit fails (then it is pending, as after its record and a
        failed commit: its writer aborts it, or it is collected), and one refused by a
        quota goes to garbage at once, as a commit refused so does.  Three statements
        fewer (the row's insert, read and delete) and one call, not two; the commit
        takes the directory and the row its check found (a walk of the path, not two)."""
        ns = self.namespace
        with ns.tx():
            # planned without a check: it is here, and its commit finds the path it found
            refused, placed = self._check_planned(upload)
            if refused is not None:
                if not isinstance(refused, SpecChanged):    # pending, as on PostgreSQL
                    ns.begin_uploads([upload])
                return refused
            try:
                return ns.commit_one(*committing(item), now, upload, placed)
            except QuotaExceeded as exc:    # final: its chunks are collected, no row made
                ns.discard(upload, now)
                return exc
            except StagerError as exc:
                ns.begin_uploads([upload])
                return exc

    async def abort_uploads(self, file_ids: Sequence[str], *, now: float
                            ) -> list[StagerError | None]:
        return await self.thread.write(self.namespace.abort_uploads, file_ids, now=now)

    async def replace_upload_layout(self, file_id: str, old: Layout, new: Layout) -> bool:
        return await self.thread.run(self.namespace.replace_upload_layout, file_id, old, new)

    # -- garbage collection -------------------------------------------------------
    async def expired_uploads(self, before: float) -> list[Upload]:
        return await self.thread.run(self.namespace.expired_uploads, before)

    async def take_garbage(self, limit: int) -> list[Garbage]:
        return await self.thread.run(self.namespace.take_garbage, limit)

    async def drop_garbage(self, file_ids: list[str], *, now: float, forget_before: float
                           ) -> None:
        await self.thread.run(self.namespace.drop_garbage, file_ids, now, forget_before)

    async def retired(self, file_id: str) -> bool:
        return await self.thread.run(self.namespace.retired, file_id)

    # -- reliability ------------------------------------------------------------------
    async def file_by_id(self, file_id: str) -> StoredFile | None:
        return await self.thread.run(self.files.file_by_id, file_id)

    async def path_of_file(self, file_id: str) -> str | None:
        return await self.thread.run(self.files.path_of_file, file_id)

    async def files_page(self, *, after: int, limit: int,
                         targets: frozenset[str] | None = None) -> list[StoredFile]:
        return await self.thread.run(self.files.files_page, after=after, limit=limit,
                                     targets=targets)

    async def replace_layout(self, file_id: str, old: Layout, new: Layout) -> bool:
        return await self.thread.run(self.files.replace_layout, file_id, old, new)

    # -- tokens -----------------------------------------------------------------------
    async def put_token(self, info: TokenInfo) -> None:
        await self.thread.run(self.tokens.put, info)

    async def list_tokens(self) -> list[TokenInfo]:
        return await self.thread.run(self.tokens.list)

    async def revoke_token(self, token_id: str, *, now: int) -> TokenInfo:
        return await self.thread.run(self.tokens.revoke, token_id, now)

    async def take_token_use(self, token_id: str) -> bool:
        return await self.thread.run(self.tokens.take_use, token_id)

    async def target_credential(self, target_id: str) -> str | None:
        return await self.thread.run(self.tokens.pinned, target_id)

    async def pin_target_credential(self, target_id: str, token_id: str, *,
                                    replaces: str | None) -> bool:
        return await self.thread.run(self.tokens.pin, target_id, token_id, replaces)

    async def forget_target(self, target_id: str) -> None:
        await self.thread.run(self.tokens.forget_target, target_id)

    # -- copying a whole store --------------------------------------------------------
    async def dump_entries(self, *, after: int, limit: int) -> list[EntryRecord]:
        return await self.thread.run(self.copies.dump_entries, after=after, limit=limit)

    async def load_entries(self, records: Sequence[EntryRecord]) -> None:
        await self.thread.run(self.copies.load_entries, records)

    async def dump_manifests(self, *, after: int, limit: int) -> list[ManifestRecord]:
        return await self.thread.run(self.copies.dump_manifests, after=after, limit=limit)

    async def load_manifests(self, records: Sequence[ManifestRecord]) -> None:
        await self.thread.run(self.copies.load_manifests, records)

    async def dump_garbage(self, *, after: str, limit: int) -> list[Garbage]:
        return await self.thread.run(self.copies.dump_garbage, after=after, limit=limit)

    async def load_garbage(self, items: Sequence[Garbage]) -> None:
        await self.thread.run(self.copies.load_garbage, items)

    # -- targets ----------------------------------------------------------------------
    async def upsert_target(self, target: TargetInfo) -> None:
        await self.thread.run(self.namespace.upsert_target, target)

    async def list_targets(self) -> list[TargetInfo]:
        return await self.thread.run(self.namespace.list_targets)

    async def touch_target(self, target: TargetInfo) -> None:
        await self.thread.run(self.states.touch_target, target)

    # -- shared state (one server: kept for its restarts) ------------------------------
    async def put_state(self, key: str, value: dict[str, Any] | None) -> None:
        await self.thread.run(self.states.put_state, key, value)

    async def get_states(self, prefix: str) -> dict[str, dict[str, Any]]:
        return await self.thread.run(self.states.get_states, prefix)

    async def put_report(self, key: str, body: dict[str, Any], *, expires: float) -> None:
        await self.thread.run(self.states.put_report, key, body, expires)

    async def live_reports(self, now: float) -> dict[str, dict[str, Any]]:
        return await self.thread.run(self.states.live_reports, now)

    async def hold_duties(self) -> bool:
        return True             # one server per SQLite file: it always runs them

    # -- quotas and pins ----------------------------------------------------------------
    async def set_quota(self, path: str, *, max_bytes: int | None,
                        max_files: int | None) -> Quota:
        return await self.thread.run(self.namespace.set_quota, path, max_bytes, max_files)

    async def list_quotas(self) -> list[Quota]:
        return await self.thread.run(self.namespace.quotas.list_quotas)

    async def pin(self, path: str, *, expires: float | None, now: float) -> Pin:
        return await self.thread.run(self.namespace.pin, path, expires, now)

    async def unpin(self, path: str) -> None:
        await self.thread.run(self.namespace.quotas.unpin, paths.normalize(path))

    async def pins(self, now: float) -> list[Pin]:
        return await self.thread.run(self.namespace.quotas.pins, now)

    # -- the managed cache (.sqlite.cache) ----------------------------------------------
    async def put_attachment(self, record: AttachmentRecord) -> None:
        await self.thread.run(self.cache.put_attachment, record)

    async def attachments(self) -> list[AttachmentRecord]:
        return await self.thread.run(self.cache.attachments)

    async def drop_attachment(self, path: str) -> list[CachedFile]:
        return await self.thread.run(self.cache.drop_attachment, path)

    async def put_cached_files(self, files: Sequence[CachedFile]) -> None:
        await self.thread.run(self.cache.put_cached_files, files)

    async def cached_files(self, attachment: str) -> list[CachedFile]:
        return await self.thread.run(self.cache.cached_files, attachment)

    async def find_cached(self, file_ids: Sequence[str]) -> dict[str, CachedFile]:
        return await self.thread.run(self.cache.find_cached, file_ids)

    async def drop_cached_files(self, file_ids: Sequence[str]) -> None:
        await self.thread.run(self.cache.drop_cached_files, file_ids)

    async def filled_chunks(self, file_id: str, indexes: Sequence[int]) -> dict[int, int]:
        return await self.thread.run(self.cache.filled_chunks, file_id, indexes)

    async def take_fill(self, file_id: str, index: int, holder: str, *, until: float,
                        now: float) -> bool:
        return await self.thread.run(self.cache.take_fill, file_id, index, holder, until, now)

    async def record_fill(self, file_id: str, index: int, *, size: int, crc: int,
                          now: float) -> bool:
        return await self.thread.run(self.cache.record_fill, file_id, index, size, crc, now)

    async def release_fill(self, file_id: str, index: int, holder: str) -> None:
        await self.thread.run(self.cache.release_fill, file_id, index, holder)

    async def touch_chunks(self, chunks: Sequence[tuple[str, int]], now: float,
                           counts: dict[str, tuple[int, int]] | None = None) -> None:
        # not flushed when alone: a use time or a hit count lost with the machine
        # costs an eviction choice, never data
        await self.thread.write(self._unflushed, self.cache.touch_chunks, chunks, now, counts)

    async def cache_chunks(self, *, after: tuple[str, int] = ("", -1),
                           limit: int = 10000) -> list[CachedChunk]:
        return await self.thread.run(self.cache.cache_chunks, after, limit)

    async def evict_chunks(self, chunks: Sequence[tuple[str, int]]) -> None:
        await self.thread.run(self.cache.evict_chunks, chunks)

    async def cache_usage(self) -> dict[str, tuple[int, int, int, int]]:
        return await self.thread.run(self.cache.cache_usage)

    # -- idempotency keys -------------------------------------------------------------
    async def recorded_answer(self, key: str) -> tuple[int, bytes] | None:
        return await self.thread.run(self.answers.get, key)

    async def record_answer(self, key: str, status: int, body: bytes, *, now: float) -> bool:
        return await self.thread.write(self._unflushed, self.answers.put, key, status, body,
                                       now)

    async def expire_answers(self, before: float) -> int:
        return await self.thread.run(self.answers.expire, before)
