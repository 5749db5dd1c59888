"""Copying a whole namespace from one metadata store to another (``stager meta migrate``).

Everything a metadata server keeps goes across as stored: directories with their
default layouts and mtimes, committed files (size, mtime, file id, layout,
checksums), manifests, the target registry, minted tokens (their records; a
token's text is never stored), S3 keys (still sealed: the new store's metadata servers
need the same auth directory's ``s3.key``), and files waiting to be purged.  Entries keep
their row ids, so the tree and the order rebuild and fsck page in are the same.
Chunks stay where they are: file ids and layouts are kept, so the data servers
need nothing, and a metadata server started on the new store serves the same
files from the same targets.

Attached directories go across with their files' rows (source key and version), but
not which of their chunks are filled: a migrated cache starts cold.  The bytes already
fetched stay on the data servers under the same file ids and are written over by the
first read's fill (or purged with the file on a detach), so nothing is served that
was not fetched again.

Uploads in progress are not copied: a writer that was mid-file when its server
stopped cannot commit on the new store.  Their chunks are not lost track of
either: each becomes garbage in the new store, which the new server purges.
S3 multipart uploads in progress are copied (their records, parts and pending final
files): an S3 client that began one goes on sending parts, hours or days apart, and
completes it on the new store as it would have on the old one.

The copy is made page by page, each page one transaction of the target store;
the source is only read.  A source a metadata server is serving is refused
(:func:`refuse_served`): a server still writing to it while the copy runs would
leave the two apart.  A SQLite store's server holds ``ROOT/meta.lock``; a
PostgreSQL store's servers hold the duty lock and record themselves as they run
(:mod:`.presence`).  The counts are checked at the end all the same.
The target store must be empty, so a copy never merges two namespaces.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ...config import Config
from ...errors import AlreadyExists, InternalError, NotFound
from .. import presence
from .base import Garbage, MetaStore, Upload
from .sqlite.store import SQLiteStore

PAGE = 1000


@dataclass
class MigrationReport:
    """What was copied (counts), and the pending uploads left behind as garbage."""

    directories: int = 0         # the root included
    files: int = 0
    bytes: int = 0
    manifests: int = 0
    targets: int = 0
    tokens: int = 0
    s3_keys: int = 0
    quotas: int = 0
    pins: int = 0
    attachments: int = 0
    cached_files: int = 0
    garbage: int = 0
    uploads_dropped: int = 0
    multipart_uploads: int = 0

    def to_json(self) -> dict[str, int]:
        return asdict(self)


async def emptiness(store: MetaStore) -> list[str]:
    """What ``store`` already holds (nothing: an empty list), in words."""
    held = []
    files, dirs, _ = await store.counts()
    if files or dirs > 1:
        held.append(f"{files} files and {dirs - 1} directories")
    if (await store.stat("/")).default_layout is not None:
        held.append("a default layout on /")
    try:
        await store.get_manifest("/")
        held.append("a manifest on /")
    except NotFound:
        pass
    for name, found in (("targets", await store.list_targets()),
                        ("tokens", await store.list_tokens()),
                        ("S3 keys", await store.list_s3_keys()),
                        ("quotas", await store.list_quotas()),
                        ("pins", await store.pins(time.time())),
                        ("attached directories", await store.attachments()),
                        ("uploads in progress", await store.expired_uploads(math.inf)),
                        ("files waiting to be purged", await store.take_garbage(1))):
        if found:
            held.append(name)
    return held


async def refuse_served(source: MetaStore, *, silent: float | None = None) -> None:
    """:class:`~stager.errors.AlreadyExists` when a metadata server is serving
    ``source``: one holds the lock of a SQLite store; on a shared store, one holds
    the duty lock, or one recorded itself less than ``silent`` seconds ago (default:
    what ``status`` counts as down with the default configuration)."""
    if isinstance(source, SQLiteStore):
        lock = presence.lock_path(source.path)
        pid = presence.lock_holder(lock)
        if pid is not None:
            raise AlreadyExists(f"a metadata server (pid {pid}) is serving {source.path} "
                                f"(it holds {lock}): stop it before migrating", pid=pid)
        return
    if not source.shared:
        return
    silent = presence.down_after(Config()) if silent is None else silent
    live = [m.url for m in await presence.live_servers(source, silent, time.time())]
    if live:
        raise AlreadyExists(f"metadata servers are serving the source store: "
                            f"{', '.join(live)}: stop them before migrating (one killed "
                            f"counts as stopped {silent:.0f}s after it was last seen)",
                            servers=live)
    if not await source.hold_duties():
        raise AlreadyExists("a metadata server holds the source store's duty lock: stop "
                            "every metadata server of the source before migrating")


async def migrate(source: MetaStore, target: MetaStore, *, page: int = PAGE,
                  progress: Callable[[str], None] | None = None) -> MigrationReport:
    """Copy everything in ``source`` into the empty ``target``; what was copied.

    Raises :class:`~stager.errors.AlreadyExists` (and copies nothing) when a metadata
    server is serving ``source`` (:func:`refuse_served`) or ``target`` is not empty,
    and :class:`~stager.errors.InternalError` when the copy's counts differ from the
    source's at the end (the source changed meanwhile)."""
    say = progress or (lambda _: None)
    await refuse_served(source)
    held = await emptiness(target)
    if held:
        raise AlreadyExists("the target metadata store is not empty (it has "
                            + ", ".join(held) + "): migrate into a fresh one", held=held)
    report = MigrationReport()
    after = 0
    while batch := await source.dump_entries(after=after, limit=page):
        await target.load_entries(batch)
        for r in batch:
            if r.kind == "file":
                report.files += 1
                report.bytes += r.size
            else:
                report.directories += 1
        after = batch[-1].row
        say(f"entries: {report.directories} directories, {report.files} files")
    after = 0
    while manifests := await source.dump_manifests(after=after, limit=page):
        await target.load_manifests(manifests)
        report.manifests += len(manifests)
        after = manifests[-1].dir_row
    for t in await source.list_targets():
        await target.upsert_target(t)
        report.targets += 1
    for token in await source.list_tokens():
        await target.put_token(token)
        report.tokens += 1
    keys = await source.list_s3_keys()
    for i in range(0, len(keys), page):
        await target.put_s3_keys(keys[i:i + page])
    report.s3_keys = len(keys)
    for quota in await source.list_quotas():    # its use counted again from the copy
        await target.set_quota(quota.path, max_bytes=quota.bytes, max_files=quota.files)
        report.quotas += 1
    for pin in await source.pins(time.time()):
        await target.pin(pin.path, expires=pin.expires, now=pin.created)
        report.pins += 1
    for attachment in await source.attachments():      # the cache starts cold
        await target.put_attachment(attachment)
        files = await source.cached_files(attachment.path)
        for i in range(0, len(files), page):
            await target.put_cached_files(files[i:i + page])
        report.attachments += 1
        report.cached_files += len(files)
    kept = await _copy_multipart(source, target, report)
    await _copy_garbage(source, target, page, report, kept)
    expected = await source.counts()
    copied = await target.counts()
    if copied != expected:
        raise InternalError(f"the copy holds (files, directories, bytes) {copied}, the source "
                            f"{expected}: was the source's metadata server still running?",
                            copied=list(copied), source=list(expected))
    say(f"done: {report.to_json()}")
    return report


async def _copy_multipart(source: MetaStore, target: MetaStore,
                          report: MigrationReport) -> set[str]:
    """S3 multipart uploads in progress, each with its pending final file and its parts
    as written; the final files' ids.  A record whose pending file is gone (it cannot
    complete) is left behind, as its server's collection would drop it."""
    records = await source.idle_multipart(math.inf)
    if not records:
        return set()
    pending = {u.file_id: u for u in await source.get_uploads([r.file_id for r in records])
               if isinstance(u, Upload)}
    kept = set()
    for record in records:
        upload = pending.get(record.file_id)
        if upload is None:
            continue
        await target.begin_uploads([upload])
        await target.begin_multipart(record)
        for part in await source.list_parts(record.upload_id):
            await target.put_part(record.upload_id, part)
        kept.add(record.file_id)
        report.multipart_uploads += 1
    return kept


async def _copy_garbage(source: MetaStore, target: MetaStore, page: int,
                        report: MigrationReport, kept: set[str]) -> None:
    """Files waiting to be purged, and the chunks of uploads in progress (not copied:
    they become garbage, so the new server purges what they wrote), but for the
    multipart uploads' final files in ``kept`` (copied)."""
    after = ""
    while items := await source.dump_garbage(after=after, limit=page):
        await target.load_garbage(items)
        report.garbage += len(items)
        after = items[-1].file_id
    pending = [u for u in await source.expired_uploads(math.inf) if u.file_id not in kept]
    if pending:
        await target.load_garbage([Garbage(u.file_id, u.layout, 0, u.created) for u in pending])
    report.uploads_dropped = len(pending)
