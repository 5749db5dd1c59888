"""Batched creates, commits and aborts: many files, one store transaction each step.

The batch operations of :class:`~stager.meta.service.MetaService`, written over
its public methods and its store.  A batch does what the single operations do,
item by item, with the same checks and the same errors; what changes is the
cost: a create batch is one read pass over the namespace and one fsynced
transaction, a commit batch one read pass and one transaction, in place of
several store calls and one fsync per file.  An item that fails is reported in
its place and changes nothing; the others go ahead (see
:mod:`stager.protocol.batch` for the wire semantics).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import BadRequest, IsADirectory, StagerError, UploadNotFound
from ..protocol.batch import CommitItem, CreateItem, check_count
from ..protocol.models import FileInfo, LayoutSpec
from . import opkey
from .store.base import NodeEntry, Upload

if TYPE_CHECKING:
    from .service import MetaService

Created = tuple[Upload, FileInfo]


def check_commit(chunk_size: int, size: int, checksums: Sequence[int]) -> None:
    """What a commit of an upload in chunks of ``chunk_size`` must satisfy: a size, and
    one checksum per chunk of it."""
    if size < 0:
        raise BadRequest("size must not be negative")
    expected = -(-size // chunk_size)
    if len(checksums) != expected:
        raise BadRequest(f"a {size}-byte file has {expected} chunks, "
                         f"got {len(checksums)} checksums")


async def create_many(service: MetaService, items: Sequence[CreateItem]
                      ) -> list[Created | StagerError]:
    """Begin a write of each item: its upload and a FileInfo with layout and
    locations, or the error a single create would have raised."""
    check_count(len(items))
    results: list[Created | StagerError | None] = [None] * len(items)
    todo = []
    for i, item in enumerate(items):
        try:
            if item.path == "/":
                raise IsADirectory("the root is a directory", path=item.path)
            if item.layout is not None:
                item.layout.validate(service.config.max_chunk_size)
        except StagerError as exc:
            results[i] = exc
            continue
        todo.append(i)
    inherited = await service.store.check_creates([
        (items[i].path, items[i].overwrite, items[i].parents) for i in todo])
    uploads = _plan_uploads(service, items, todo, inherited, results)
    # a retry: the uploads the first try began are answered, not begun again
    earlier = await opkey.earlier_uploads(service.store, [u.file_id for _, u in uploads])
    uploads = [(i, earlier.get(u.file_id, u)) for i, u in uploads]
    fresh = [u for _, u in uploads if u.file_id not in earlier]
    if fresh:
        await service.store.begin_uploads(fresh)
    for i, upload in uploads:
        results[i] = (upload, service.info(NodeEntry(upload.path, "file", 0, upload.created,
                                                     upload.file_id, upload.layout)))
    return _filled(results)


def _plan_uploads(service: MetaService, items: Sequence[CreateItem], todo: list[int],
                  inherited: list[LayoutSpec | StagerError],
                  results: list[Any]) -> list[tuple[int, Upload]]:
    """Choose each file's layout as :meth:`MetaService.create` does."""
    healthy = service.placeable_targets()
    uploads = []
    for i, spec in zip(todo, inherited, strict=True):
        if isinstance(spec, StagerError):
            results[i] = spec
            continue
        item = items[i]
        try:
            upload = service.new_upload(
                item.path, (item.layout or LayoutSpec()).merged_over(spec),
                overwrite=item.overwrite, parents=item.parents, healthy=healthy)
        except StagerError as exc:
            results[i] = exc
            continue
        uploads.append((i, upload))
    return uploads


async def commit_many(service: MetaService, items: Sequence[CommitItem]
                      ) -> list[FileInfo | StagerError]:
    """Make each upload visible, in one transaction; failed items change nothing."""
    check_count(len(items))
    uploads = await service.store.get_uploads([i.file_id for i in items])
    results: list[FileInfo | StagerError | None] = [None] * len(items)
    todo = []
    for i, (item, upload) in enumerate(zip(items, uploads, strict=True)):
        try:
            if isinstance(upload, UploadNotFound):
                done = await opkey.after_gone(service.store, item.file_id, upload)
                results[i] = service.info(done)     # a retry: the first try committed it
                continue
            if isinstance(upload, StagerError):
                raise upload
            check_commit(upload.layout.chunk_size, item.size, item.checksums)
        except StagerError as exc:
            results[i] = exc
            continue
        todo.append(i)
    now = service.clock()
    entries = await service.store.commit_uploads([
        (items[i].file_id, items[i].size, items[i].checksums, items[i].mtime or now)
        for i in todo], now=now) if todo else []
    for i, entry in zip(todo, entries, strict=True):
        results[i] = entry if isinstance(entry, StagerError) else service.info(entry)
    return _filled(results)


async def abort_many(service: MetaService, file_ids: Sequence[str]
                     ) -> list[StagerError | None]:
    """Abandon each upload (its chunks are collected); ``None`` where it went."""
    check_count(len(file_ids))
    if not file_ids:
        return []
    return await service.store.abort_uploads(file_ids, now=service.clock())


def _filled(results: list[Any]) -> list[Any]:
    assert all(r is not None for r in results)
    return results
