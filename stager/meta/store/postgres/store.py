"""The networked metadata store: PostgreSQL, through asyncpg, on the server's own loop.

:class:`PostgreSQLStore` implements :class:`~.store.base.MetaStore` natively: each
call is a coroutine that waits on the database without a thread.  The
connection pool, the schema and its migrations, and the retries of conflicted
transactions live in :mod:`.postgres.db`; the SQL in :mod:`.postgres.namespace` (paths,
directories, manifests), :mod:`.postgres.uploads` (writes, batches, garbage),
:mod:`.postgres.files` (files by id, tokens, targets) and :mod:`.postgres.cache`
(attached directories and their filled chunks).  Writes of uploads that queue
up while one is under way share one transaction (:mod:`.postgres.group`), as the
SQLite store's do; everything else runs in a transaction of its own, several at
once over the pool.

Selected by ``stager meta --store postgresql://USER@HOST:PORT/DB`` (also
``STAGER_META_STORE`` and the configuration file).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Sequence
from typing import Any

import asyncpg

from ....errors import StagerError
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
)
from ..caching import AttachmentRecord, CachedChunk, CachedFile
from . import answers as answers
from . import cache as cache
from . import copy as copies
from . import files as files
from . import namespace as ns
from . import quotas as quotas
from . import shared as share
from . import uploads as up
from .db import Database, Op
from .group import MAX_GROUP, WriteGroups
from .multipart import PostgresMultipart
from .s3keys import PostgresS3Keys
from .shared import DutyLock


class PostgreSQLStore(PostgresMultipart, PostgresS3Keys, MetaStore):
    """The store in the PostgreSQL database at ``url``; connects on first use (then
    creates or migrates its schema), up to ``pool_size`` connections; up to
    ``max_group`` queued upload writes share one transaction (1: none do)."""

    shared = True               # several metadata servers may use one database
    # Writes of uploads run one group at a time, in the order made (.postgres.group), so
    # a commit queued right behind its upload's begin sees it; the two of one file then
    # run as one statement (uploads.put): a small file's gateway PUT makes one round
    # trip for both.
    in_order = True

    def __init__(self, url: str, *, pool_size: int = 10, max_group: int = MAX_GROUP,
                 connect_timeout: float = 5.0) -> None:
        self.db = Database(url, pool_size=pool_size, connect_timeout=connect_timeout)
        # Public: its counters say how writes were grouped (tests, benchmarks).
        self.writes = WriteGroups(self.db, max_group=max_group)
        self.duties = DutyLock(url, connect_timeout)
        self._closed = False

    def close(self) -> None:
        """From another thread while the loop runs (the metadata server closes its
        store through ``asyncio.to_thread``): finish the calls under way, then close.
        On the loop's own thread nothing may wait: queued writes are refused and the
        connections dropped (a transaction not committed never happened)."""
        if self._closed:
            return
        self._closed = True
        loop = self.db.loop
        if loop is None:
            return
        if loop.is_running() and threading.get_ident() != self.db.loop_thread:
            asyncio.run_coroutine_threadsafe(self._aclose(), loop).result(timeout=60)
            return
        self.writes.cancel()
        self.duties.terminate()
        self.db.terminate()

    async def _aclose(self) -> None:
        await self.duties.aclose()
        await self.writes.drain()
        await self.db.aclose()

    async def _read(self, op: Op[Any], *, snapshot: bool = False) -> Any:
        self._check_open()
        return await self.db.read(op, snapshot=snapshot)

    async def _write(self, op: Op[Any]) -> Any:
        self._check_open()
        return await self.db.write(op)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the metadata store is closed")

    # -- namespace --------------------------------------------------------------
    async def stat(self, path: str, *, checksums: bool = True) -> NodeEntry:
        entry: NodeEntry = await self._read(lambda c: ns.stat(c, path, checksums))
        return entry

    async def list_rows(self, path: str, *, after: str, limit: int) -> list[Listed]:
        return list(await self._read(lambda c: ns.list_rows(c, path, after, limit),
                                     snapshot=True))

    async def mkdir(self, path: str, *, parents: bool, exist_ok: bool, now: float,
                    layout: LayoutSpec | None = None) -> NodeEntry:
        entry: NodeEntry = await self._write(lambda c: ns.mkdir(
            c, path, parents=parents, exist_ok=exist_ok, now=now, layout=layout))
        return entry

    async def set_layout(self, path: str, layout: LayoutSpec) -> NodeEntry:
        entry: NodeEntry = await self._write(lambda c: ns.set_layout(c, path, layout))
        return entry

    async def rename(self, src: str, dst: str, *, overwrite: bool, now: float) -> NodeEntry:
        entry: NodeEntry = await self._write(lambda c: ns.rename(
            c, src, dst, overwrite=overwrite, now=now))
        return entry

    async def remove(self, path: str, *, recursive: bool, now: float) -> int:
        return int(await self._write(lambda c: ns.remove(c, path, recursive=recursive,
                                                         now=now)))

    async def counts(self) -> tuple[int, int, int]:
        return tuple(await self._read(ns.counts))  # type: ignore[return-value]

    async def subtree_files(self, path: str) -> dict[str, NodeEntry]:
        return dict(await self._read(lambda c: ns.subtree_files(c, path), snapshot=True))

    # -- manifests --------------------------------------------------------------
    async def put_manifest(self, path: str, body: bytes, *, now: float) -> None:
        await self._write(lambda c: ns.put_manifest(c, path, body, now))

    async def manifest_version(self, path: str) -> ManifestVersion:
        version: ManifestVersion = await self._read(lambda c: ns.manifest_version(c, path))
        return version

    async def get_manifest(self, path: str) -> tuple[bytes, float]:
        return tuple(await self._read(lambda c: ns.get_manifest(c, path),  # type: ignore[return-value]
                                      snapshot=True))

    # -- writes: these may share one transaction with writes queued alongside ----
    async def check_creates(self, items: Sequence[CreateCheck]
                            ) -> list[LayoutSpec | StagerError]:
        if len(items) == 1:     # one statement: one snapshot without a transaction
            [item] = items
            return [await self._read(lambda c: up.check_create(c, item))]
        return list(await self._read(lambda c: up.check_creates(c, items), snapshot=True))

    async def begin_uploads(self, uploads: Sequence[Upload]) -> None:
        self._check_open()
        # one alone: one statement that may run again, not waiting for the WAL flush
        alone = (lambda c: up.reserve(c, uploads[0])) if len(uploads) == 1 else None
        lead = (uploads[0].file_id, uploads[0]) if len(uploads) == 1 else None
        await self.writes.write(lambda c: up.begin_uploads(c, uploads), alone=alone, lead=lead)

    async def get_uploads(self, file_ids: Sequence[str]) -> list[Upload | StagerError]:
        return list(await self._read(lambda c: up.get_uploads(c, file_ids)))

    async def commit_uploads(self, items: Sequence[CommitArgs], *,
                             now: float) -> list[NodeEntry | StagerError]:
        self._check_open()
        def commit(conn: asyncpg.Connection) -> Awaitable[list[NodeEntry | StagerError]]:
            return up.commit_uploads(conn, items, now=now)

        def put(upload: Upload) -> Op[list[NodeEntry | StagerError]]:
            async def op(conn: asyncpg.Connection) -> list[NodeEntry | StagerError]:
                return [await up.put(conn, upload, items[0], now)]
            return op

        # one alone: one statement; a lost connection leaves its outcome unknown (not rerun);
        # right behind the begin of its upload, one statement with it
        one = len(items) == 1
        return list(await self.writes.write(commit, alone=commit if one else None, rerun=False,
                                            follow=(items[0][0], put) if one else None))

    async def replace_upload_layout(self, file_id: str, old: Layout, new: Layout) -> bool:
        return bool(await self._write(lambda c: up.replace_upload_layout(c, file_id, old, new)))

    async def abort_uploads(self, file_ids: Sequence[str], *, now: float
                            ) -> list[StagerError | None]:
        self._check_open()
        return list(await self.writes.write(lambda c: up.abort_uploads(c, file_ids, now=now)))

    # -- garbage collection -------------------------------------------------------
    async def expired_uploads(self, before: float) -> list[Upload]:
        return list(await self._read(lambda c: up.expired_uploads(c, before)))

    async def take_garbage(self, limit: int) -> list[Garbage]:
        return list(await self._read(lambda c: up.take_garbage(c, limit)))

    async def drop_garbage(self, file_ids: list[str], *, now: float, forget_before: float
                           ) -> None:
        await self._write(lambda c: up.drop_garbage(c, file_ids, now, forget_before))

    async def retired(self, file_id: str) -> bool:
        return bool(await self._read(lambda c: up.retired(c, file_id)))

    # -- reliability ------------------------------------------------------------------
    async def file_by_id(self, file_id: str) -> StoredFile | None:
        found: StoredFile | None = await self._read(lambda c: files.file_by_id(c, file_id))
        return found

    async def path_of_file(self, file_id: str) -> str | None:
        found: str | None = await self._read(lambda c: files.path_of_file(c, file_id))
        return found

    async def files_page(self, *, after: int, limit: int,
                         targets: frozenset[str] | None = None) -> list[StoredFile]:
        return list(await self._read(lambda c: files.files_page(
            c, after=after, limit=limit, targets=targets)))

    async def replace_layout(self, file_id: str, old: Layout, new: Layout) -> bool:
        return bool(await self._write(lambda c: files.replace_layout(c, file_id, old, new)))

    # -- tokens -----------------------------------------------------------------------
    async def put_token(self, info: TokenInfo) -> None:
        await self._write(lambda c: files.put_token(c, info))

    async def list_tokens(self) -> list[TokenInfo]:
        return list(await self._read(files.list_tokens))

    async def take_token_use(self, token_id: str) -> bool:
        return bool(await self._write(lambda c: files.take_token_use(c, token_id)))

    async def target_credential(self, target_id: str) -> str | None:
        found: str | None = await self._read(lambda c: files.target_credential(c, target_id))
        return found

    async def pin_target_credential(self, target_id: str, token_id: str, *,
                                    replaces: str | None) -> bool:
        return bool(await self._write(lambda c: files.pin_target_credential(
            c, target_id, token_id, replaces)))

    async def forget_target(self, target_id: str) -> None:
        await self._write(lambda c: files.forget_target(c, target_id))

    async def revoke_token(self, token_id: str, *, now: int) -> TokenInfo:
        info: TokenInfo = await self._write(lambda c: files.revoke_token(c, token_id, now))
        return info

    # -- copying a whole store --------------------------------------------------------
    async def dump_entries(self, *, after: int, limit: int) -> list[EntryRecord]:
        return list(await self._read(lambda c: copies.dump_entries(c, after, limit)))

    async def load_entries(self, records: Sequence[EntryRecord]) -> None:
        await self._write(lambda c: copies.load_entries(c, records))

    async def dump_manifests(self, *, after: int, limit: int) -> list[ManifestRecord]:
        return list(await self._read(lambda c: copies.dump_manifests(c, after, limit)))

    async def load_manifests(self, records: Sequence[ManifestRecord]) -> None:
        await self._write(lambda c: copies.load_manifests(c, records))

    async def dump_garbage(self, *, after: str, limit: int) -> list[Garbage]:
        return list(await self._read(lambda c: copies.dump_garbage(c, after, limit)))

    async def load_garbage(self, items: Sequence[Garbage]) -> None:
        await self._write(lambda c: copies.load_garbage(c, items))

    # -- targets ----------------------------------------------------------------------
    async def upsert_target(self, target: TargetInfo) -> None:
        await self._write(lambda c: files.upsert_target(c, target))

    async def list_targets(self) -> list[TargetInfo]:
        return list(await self._read(files.list_targets))


    async def touch_target(self, target: TargetInfo) -> None:
        await self.touch_targets([target])

    async def touch_targets(self, targets: Sequence[TargetInfo]) -> None:
        self._check_open()      # one statement, the same if run twice: no BEGIN, no COMMIT
        if targets:
            await self.db.statement(lambda c: share.touch_targets(c, targets))

    # -- what several metadata servers share (.pg_shared) ------------------------------
    async def put_state(self, key: str, value: dict[str, Any] | None) -> None:
        await self._write(lambda c: share.put_state(c, key, value))

    async def get_states(self, prefix: str) -> dict[str, dict[str, Any]]:
        return dict(await self._read(lambda c: share.get_states(c, prefix)))

    async def put_report(self, key: str, body: dict[str, Any], *, expires: float) -> None:
        await self.put_reports([(key, body, expires)])

    async def put_reports(self, reports: Sequence[tuple[str, dict[str, Any], float]]) -> None:
        self._check_open()      # one statement, as touch_targets
        if reports:
            await self.db.statement(lambda c: share.put_reports(c, reports))

    async def live_reports(self, now: float) -> dict[str, dict[str, Any]]:
        return dict(await self._write(lambda c: share.live_reports(c, now)))

    async def hold_duties(self) -> bool:
        self._check_open()
        try:
            await self.db.pool()    # opened on this loop, so that close() finds the lock
        except StagerError:
            pass                    # the database is down: the lock says no below
        return await self.duties.hold()

    # -- quotas and pins (.postgres.quotas) ---------------------------------------------
    async def set_quota(self, path: str, *, max_bytes: int | None,
                        max_files: int | None) -> Quota:
        path = paths.normalize(path)

        async def op(conn: asyncpg.Connection) -> Quota:
            dir_id = await ns.resolve_dir(conn, path)
            return await quotas.set_quota(conn, dir_id, path, max_bytes, max_files)
        quota: Quota = await self._write(op)
        return quota

    async def list_quotas(self) -> list[Quota]:
        return list(await self._read(quotas.list_quotas, snapshot=True))

    async def pin(self, path: str, *, expires: float | None, now: float) -> Pin:
        path = paths.normalize(path)

        async def op(conn: asyncpg.Connection) -> Pin:
            await ns.resolve(conn, path)         # NotFound when nothing is there
            return await quotas.pin(conn, path, expires, now)
        pinned: Pin = await self._write(op)
        return pinned

    async def unpin(self, path: str) -> None:
        await self._write(lambda c: quotas.unpin(c, path))

    async def pins(self, now: float) -> list[Pin]:
        return list(await self._write(lambda c: quotas.pins(c, now)))

    # -- the managed cache (.postgres.cache) --------------------------------------------
    async def put_attachment(self, record: AttachmentRecord) -> None:
        await self._write(lambda c: cache.put_attachment(c, record))

    async def attachments(self) -> list[AttachmentRecord]:
        return list(await self._read(cache.attachments))

    async def drop_attachment(self, path: str) -> list[CachedFile]:
        return list(await self._write(lambda c: cache.drop_attachment(c, path)))

    async def put_cached_files(self, files: Sequence[CachedFile]) -> None:
        await self._write(lambda c: cache.put_cached_files(c, files))

    async def cached_files(self, attachment: str) -> list[CachedFile]:
        return list(await self._read(lambda c: cache.cached_files(c, attachment)))

    async def find_cached(self, file_ids: Sequence[str]) -> dict[str, CachedFile]:
        return dict(await self._read(lambda c: cache.find_cached(c, file_ids)))

    async def drop_cached_files(self, file_ids: Sequence[str]) -> None:
        await self._write(lambda c: cache.drop_cached_files(c, file_ids))

    async def filled_chunks(self, file_id: str, indexes: Sequence[int]) -> dict[int, int]:
        return dict(await self._read(lambda c: cache.filled_chunks(c, file_id, indexes)))

    async def take_fill(self, file_id: str, index: int, holder: str, *, until: float,
                        now: float) -> bool:
        self._check_open()      # one statement, exclusive across servers (.postgres.cache)
        return bool(await self.db.statement(
            lambda c: cache.take_fill(c, file_id, index, holder, until, now)))

    async def record_fill(self, file_id: str, index: int, *, size: int, crc: int,
                          now: float) -> bool:
        return bool(await self._write(
            lambda c: cache.record_fill(c, file_id, index, size, crc, now)))

    async def release_fill(self, file_id: str, index: int, holder: str) -> None:
        await self._write(lambda c: cache.release_fill(c, file_id, index, holder))

    async def touch_chunks(self, chunks: Sequence[tuple[str, int]], now: float,
                           counts: dict[str, tuple[int, int]] | None = None) -> None:
        await self._write(lambda c: cache.touch_chunks(c, chunks, now, counts))

    async def cache_chunks(self, *, after: tuple[str, int] = ("", -1),
                           limit: int = 10000) -> list[CachedChunk]:
        return list(await self._read(lambda c: cache.cache_chunks(c, after, limit)))

    async def evict_chunks(self, chunks: Sequence[tuple[str, int]]) -> None:
        await self._write(lambda c: cache.evict_chunks(c, chunks))

    async def cache_usage(self) -> dict[str, tuple[int, int, int, int]]:
        return dict(await self._read(cache.cache_usage, snapshot=True))

    # -- idempotency keys -------------------------------------------------------------
    async def recorded_answer(self, key: str) -> tuple[int, bytes] | None:
        found: tuple[int, bytes] | None = await self._read(lambda c: answers.get(c, key))
        return found

    async def record_answer(self, key: str, status: int, body: bytes, *, now: float) -> bool:
        self._check_open()      # grouped with the upload writes queued meanwhile
        return bool(await self.writes.write(
            lambda c: answers.put(c, key, status, body, now),
            alone=lambda c: answers.put_lazily(c, key, status, body, now)))

    async def expire_answers(self, before: float) -> int:
        return int(await self._write(lambda c: answers.expire(c, before)))
