"""Batched creates, commits and aborts: many files, one store transaction each step.

Mixed into :class:`~stager.meta.service.MetaService`.  A batch does what the
single operations do, item by item, with the same checks and the same errors;
what changes is the cost: a create batch is one read pass over the namespace and
one fsynced transaction, a commit batch one read pass and one transaction, in
place of several store calls and one fsync per file.  An item that fails is
reported in its place and changes nothing; the others go ahead (see
:mod:`stager.protocol.batch` for the wire semantics).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from ..config import Config
from ..errors import BadRequest, IsADirectory, StagerError
from ..layout import choose_layout
from ..protocol.batch import CommitItem, CreateItem, check_count
from ..protocol.models import FileInfo, LayoutSpec, TargetInfo
from .store import MetaStore, NodeEntry, Upload

P = ParamSpec("P")
R = TypeVar("R")

Created = tuple[Upload, FileInfo]


def check_commit(upload: Upload, size: int, checksums: Sequence[int]) -> None:
    """What a commit must satisfy: a size, and one checksum per chunk of it."""
    if size < 0:
        raise BadRequest("size must not be negative")
    expected = upload.layout.chunk_count(size)
    if len(checksums) != expected:
        raise BadRequest(f"a {size}-byte file has {expected} chunks, "
                         f"got {len(checksums)} checksums")


class BatchOps:
    """The batch operations of :class:`~stager.meta.service.MetaService`."""

    if TYPE_CHECKING:   # provided by MetaService
        store: MetaStore
        config: Config
        clock: Callable[[], float]

        async def _run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R: ...
        async def _write(self, fn: Callable[P, R], *args: P.args,
                         **kwargs: P.kwargs) -> R: ...
        def _info(self, entry: NodeEntry) -> FileInfo: ...
        def healthy_targets(self) -> list[TargetInfo]: ...

    async def create_many(self, items: Sequence[CreateItem]) -> list[Created | StagerError]:
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
                    item.layout.validate(self.config.max_chunk_size)
            except StagerError as exc:
                results[i] = exc
                continue
            todo.append(i)
        inherited = await self._run(self.store.check_creates, [
            (items[i].path, items[i].overwrite, items[i].parents) for i in todo])
        uploads = self._plan_uploads(items, todo, inherited, results)
        if uploads:
            await self._write(self.store.begin_uploads, [u for _, u in uploads])
        for i, upload in uploads:
            results[i] = (upload, self._info(NodeEntry(upload.path, "file", 0, upload.created,
                                                   upload.file_id, upload.layout)))
        return _filled(results)

    def _plan_uploads(self, items: Sequence[CreateItem], todo: list[int],
                      inherited: list[LayoutSpec | StagerError],
                      results: list[Any]) -> list[tuple[int, Upload]]:
        """Choose each file's layout as :meth:`MetaService.create` does."""
        defaults = LayoutSpec(self.config.chunk_size, self.config.stripe_count,
                              self.config.replicas)
        healthy = self.healthy_targets()
        now = self.clock()
        uploads = []
        for i, spec in zip(todo, inherited, strict=True):
            if isinstance(spec, StagerError):
                results[i] = spec
                continue
            item = items[i]
            merged = (item.layout or LayoutSpec()).merged_over(spec).merged_over(defaults)
            file_id = uuid.uuid4().hex
            try:
                chosen = choose_layout(
                    healthy, chunk_size=merged.chunk_size or self.config.chunk_size,
                    stripe_count=merged.stripe_count or 0, replicas=merged.replicas or 1,
                    max_stripe_count=self.config.max_stripe_count,
                    start=int(file_id[:8], 16))
            except StagerError as exc:
                results[i] = exc
                continue
            uploads.append((i, Upload(file_id, item.path, chosen, item.overwrite,
                                      item.parents, now)))
        return uploads

    async def commit_many(self, items: Sequence[CommitItem]) -> list[FileInfo | StagerError]:
        """Make each upload visible, in one transaction; failed items change nothing."""
        check_count(len(items))
        uploads = await self._run(self.store.get_uploads, [i.file_id for i in items])
        results: list[FileInfo | StagerError | None] = [None] * len(items)
        todo = []
        for i, (item, upload) in enumerate(zip(items, uploads, strict=True)):
            try:
                if isinstance(upload, StagerError):
                    raise upload
                check_commit(upload, item.size, item.checksums)
            except StagerError as exc:
                results[i] = exc
                continue
            todo.append(i)
        now = self.clock()
        entries = await self._write(self.store.commit_uploads, [
            (items[i].file_id, items[i].size, items[i].checksums, items[i].mtime or now)
            for i in todo], now=now) if todo else []
        for i, entry in zip(todo, entries, strict=True):
            results[i] = entry if isinstance(entry, StagerError) else self._info(entry)
        return _filled(results)

    async def abort_many(self, file_ids: Sequence[str]) -> list[StagerError | None]:
        """Abandon each upload (its chunks are collected); ``None`` where it went."""
        check_count(len(file_ids))
        if not file_ids:
            return []
        return await self._write(self.store.abort_uploads, file_ids, now=self.clock())


def _filled(results: list[Any]) -> list[Any]:
    assert all(r is not None for r in results)
    return results
