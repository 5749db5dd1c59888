"""Attached directories: a stager directory that shows a source URL's files.

Attaching lists the source once and records each file as a committed entry whose
layout says ``cached`` (chunks placed as for any new file, none of them stored
yet) and a :class:`~stager.meta.store.base.CachedFile` row naming the source file
and its version (ETag, else size and mtime).  Listing and stat then come from the
namespace, as for any file; the bytes come on first read (:mod:`.fill`).

A refresh lists the source again.  A file whose version changed is committed anew
at its path, with a new file id: the old id's chunks go to garbage with the old
entry, a reader still holding the old id is told the file is gone (its fill finds
no row), and no read can mix old and new bytes.  A file gone from the source is
removed (404 from then on).  A file a user wrote into the directory (not a cached
file) is left alone, even where the source has one of the same name.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...errors import AlreadyExists, BadRequest, Forbidden, NotFound, StagerError
from ...protocol import paths
from ...protocol.batch import MAX_BATCH_ITEMS
from ...protocol.cache import Attachment, AttachRequest, Refreshed
from ...protocol.models import LayoutSpec
from ...sources.source import Source, source_etag, source_mtime
from ..store.base import Upload
from ..store.caching import AttachmentRecord, CachedFile
from ..writes import new_upload

if TYPE_CHECKING:
    from ..service import MetaService
    from .sources import Sources

log = logging.getLogger(__name__)
MAX_ATTACHED_FILES = 1_000_000      # files one attachment may list
MAX_ERRORS_SHOWN = 10               # reasons a listing's answer gives for files not shown


def version_of(info: dict[str, Any]) -> str:
    """What tells one version of a source file from the next: its ETag, else size
    and modification time."""
    etag = source_etag(info)
    return f"etag:{etag}" if etag else f"{info.get('size')}:{source_mtime(info)}"


def wanted(rel: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """Whether source path ``rel`` (relative to the source's root) is shown."""
    if include and not any(fnmatch.fnmatchcase(rel, g) for g in include):
        return False
    return not any(fnmatch.fnmatchcase(rel, g) for g in exclude)


def check_allowed(url: str, allowed: str) -> None:
    """``url`` must start with one of the ``attach_sources`` prefixes (when set): an
    admin of the namespace names only the sources the operator let the servers read."""
    prefixes = [p.strip() for p in allowed.split(",") if p.strip()]
    if prefixes and not any(url.startswith(p) for p in prefixes):
        raise Forbidden(f"source {url} is not among this cluster's attach_sources "
                        f"({', '.join(prefixes)})", source=url)


def check_local_source(url: str, forbidden: Sequence[str]) -> None:
    """A ``file://`` source must not show the metadata server's own files (its
    store, its keys): an admin of the namespace is not an admin of the host."""
    if not url.startswith("file://"):
        return
    real = os.path.realpath(url[len("file://"):])
    for root in forbidden:
        top = os.path.realpath(root)
        if real == top or real.startswith(top + os.sep) or top.startswith(real + os.sep):
            raise BadRequest(f"source {url} overlaps the metadata server's own directory",
                             source=url)


class Attachments:
    """Attach, refresh, detach and list; one listing of a source at a time per path."""

    def __init__(self, service: MetaService, sources: Sources) -> None:
        self.service = service
        self.store = service.store
        self.sources = sources

    async def attach(self, path: str, request: AttachRequest) -> Refreshed:
        """Attach ``path`` to the request's source (or change the attachment there)
        and list it.  ``path`` must be new, an empty directory, or attached already."""
        path = paths.normalize(path)
        if path == "/":
            raise BadRequest("the root cannot be attached", path=path)
        check_allowed(request.source, self.service.config.attach_sources)
        check_local_source(request.source, self.sources.forbidden)
        old = {a.path: a for a in await self.store.attachments()}
        for other in old:
            if other != path and (paths.is_within(path, other) or paths.is_within(other, path)):
                raise AlreadyExists(f"{path} overlaps the attached directory {other}",
                                    path=path, attachment=other)
        if path not in old:
            await self._check_empty(path)
        now = self.service.clock()
        record = AttachmentRecord(
            path, request.source, self.sources.box.seal(request.options), request.refresh,
            request.include, request.exclude, 0.0, old[path].created if path in old else now)
        self.sources.forget(path)
        source = await self.sources.open(record)        # fails here on a bad URL or options
        await self.store.put_attachment(record)
        try:
            return await self._sync(record, source)
        except StagerError:
            if path not in old:         # a new attachment whose source cannot be listed
                await self.detach(path)
            raise

    async def refresh(self, path: str) -> Refreshed:
        record = await self.record(path)
        return await self._sync(record, await self.sources.open(record))

    async def detach(self, path: str) -> tuple[int, int]:
        """Forget the view at ``path``; its files go (their chunks to garbage).
        Returns (files, cached chunks) it had."""
        path = paths.normalize(path)
        usage = (await self.store.cache_usage()).get(path, (0, 0, 0, 0))
        files = await self.store.drop_attachment(path)
        self.sources.forget(path)
        try:
            await self.service.remove(path, recursive=True)
        except NotFound:
            pass
        return len(files), usage[2]

    async def record(self, path: str) -> AttachmentRecord:
        path = paths.normalize(path)
        for a in await self.store.attachments():
            if a.path == path:
                return a
        raise NotFound(f"{path} is not an attached directory", path=path)

    async def list(self) -> list[Attachment]:
        usage = await self.store.cache_usage()
        return [_shown(a, usage.get(a.path, (0, 0, 0, 0))) for a in await self.store.attachments()]

    async def due(self, now: float) -> list[AttachmentRecord]:
        """The attachments whose ``refresh`` interval has passed since their listing."""
        return [a for a in await self.store.attachments()
                if a.refresh is not None and a.listed + a.refresh <= now]

    async def _check_empty(self, path: str) -> None:
        try:
            info = await self.service.stat(path)
        except NotFound:
            return
        if not info.is_dir:
            raise AlreadyExists(f"{path} is a file", path=path)
        entries, _ = await self.service.list(path, limit=1)
        if entries:
            raise AlreadyExists(f"{path} is not empty: attach to a new or empty directory",
                                path=path)

    async def _sync(self, record: AttachmentRecord, source: Source) -> Refreshed:
        """List the source and bring the view in step with it (see the module docstring)."""
        listed = await source.files()
        shown: dict[str, tuple[str, dict[str, Any]]] = {}
        for key, info in listed.items():
            rel = source.relative(key)
            if rel and wanted(rel, record.include, record.exclude):
                shown[paths.join(record.path, rel)] = (key, info)
        if len(shown) > MAX_ATTACHED_FILES:
            raise BadRequest(f"{record.source} has {len(shown)} files; an attachment shows "
                             f"at most {MAX_ATTACHED_FILES} (narrow it with --include)")
        have = {f.path: f for f in await self.store.cached_files(record.path)}
        fresh, changed, unchanged = [], 0, 0
        for path, (key, info) in sorted(shown.items()):
            version = version_of(info)
            old = have.get(path)
            if old is not None and old.version == version and old.key == key:
                unchanged += 1
                continue
            changed += old is not None
            fresh.append((path, key, version, info))
        gone = [f for p, f in have.items() if p not in shown]
        errors = await self._commit(record, fresh)
        for f in gone:
            try:
                await self.service.remove(f.path)
            except NotFound:
                pass
        await self.store.drop_cached_files([f.file_id for f in gone] +
                                           [have[p].file_id for p, *_ in fresh if p in have])
        now = self.service.clock()
        await self.store.put_attachment(dataclasses.replace(record, listed=now))
        if errors:
            log.warning("attach %s: %d files not shown: %s", record.path, len(errors), errors[0])
        usage = (await self.store.cache_usage()).get(record.path, (0, 0, 0, 0))
        return Refreshed(_shown(dataclasses.replace(record, listed=now), usage),
                         len(fresh) - changed - len(errors), changed, len(gone), unchanged,
                         len(errors), tuple(str(e) for e in errors[:MAX_ERRORS_SHOWN]))

    async def _commit(self, record: AttachmentRecord,
                      fresh: list[tuple[str, str, str, dict[str, Any]]]) -> list[StagerError]:
        """Commit each new or changed source file as a cached file, a batch at a time;
        the errors of those that could not be (a user's own file in the way)."""
        errors: list[StagerError] = []
        for start in range(0, len(fresh), MAX_BATCH_ITEMS):
            errors += await self._commit_batch(record, fresh[start:start + MAX_BATCH_ITEMS])
        return errors

    async def _commit_batch(self, record: AttachmentRecord,
                            batch: list[tuple[str, str, str, dict[str, Any]]]
                            ) -> list[StagerError]:
        service, store = self.service, self.store
        mine = {f.path for f in await store.cached_files(record.path)}
        inherited = await store.check_creates([(p, p in mine, True) for p, *_ in batch])
        healthy = service.placeable_targets()
        errors: list[StagerError] = []
        uploads: list[tuple[Upload, str, str, dict[str, Any]]] = []
        for (path, key, version, info), spec in zip(batch, inherited, strict=True):
            if isinstance(spec, StagerError):
                errors.append(spec)
                continue
            upload = new_upload(service, path, LayoutSpec().merged_over(spec),
                                overwrite=path in mine, parents=True, healthy=healthy)
            upload = dataclasses.replace(
                upload, layout=dataclasses.replace(upload.layout, cached=True))
            uploads.append((upload, key, version, info))
        if not uploads:
            return errors
        await store.begin_uploads([u for u, *_ in uploads])
        await store.put_cached_files([CachedFile(u.file_id, record.path, u.path, key, version)
                                      for u, key, version, _ in uploads])
        now = service.clock()
        committed = await store.commit_uploads([
            (u.file_id, int(info["size"]), (0,) * u.layout.chunk_count(int(info["size"])),
             source_mtime(info) or now) for u, _, _, info in uploads], now=now)
        failed = [u.file_id for (u, *_), got in zip(uploads, committed, strict=True)
                  if isinstance(got, StagerError)]
        if failed:
            await store.drop_cached_files(failed)
            await store.abort_uploads(failed, now=now)
        return errors + [got for got in committed if isinstance(got, StagerError)]


def _shown(record: AttachmentRecord, usage: tuple[int, int, int, int]) -> Attachment:
    files, total, chunks, cached = usage
    return Attachment(record.path, record.source, record.refresh, record.include,
                      record.exclude, record.listed, files, total, cached, chunks,
                      record.hits, record.misses)
