"""The writes of :class:`~stager.meta.service.MetaService`: creates, commits and aborts.

Every write is a batch; a single one is a batch of one (its caller takes the one
result with :func:`stager.protocol.batch.one`).  A batch does item by item what one
write does, with the same checks and the same errors, at the cost of one: a create
batch is one read pass over the namespace and one transaction, a commit batch one
transaction (and one read, only for uploads this server did not begin: see
:class:`Begun`).  An item that fails is reported in its place and changes nothing;
the others go ahead (see :mod:`stager.protocol.batch` for the wire semantics).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..bounded import Bounded
from ..errors import BadRequest, IsADirectory, StagerError, UploadNotFound
from ..layout import choose_layout
from ..protocol import paths
from ..protocol.batch import CommitItem, CreateItem, check_count
from ..protocol.models import FileInfo, LayoutSpec, TargetInfo
from . import opkey
from .store.base import NodeEntry, Upload

if TYPE_CHECKING:
    from .service import MetaService

Created = tuple[Upload, FileInfo]
BEGUN_KEPT = 65536        # uploads whose chunk size a commit finds in memory
HINTS_KEPT = 4096         # directories whose layout spec a small PUT is planned with


class SpecHints:
    """The layout spec each directory hands down its new files, as this server last saw
    it (a check of a create there, or a put's store refusing an older one), the newest
    last; ``LayoutSpec()`` for one not seen.  A small gateway PUT is planned with it and
    no check (:func:`plan_hinted`): its store checks it in the put itself."""

    def __init__(self, kept: int = HINTS_KEPT) -> None:
        self._specs: Bounded[str, LayoutSpec] = Bounded(kept)

    def get(self, parent: str) -> LayoutSpec:
        return self._specs.get(parent, LayoutSpec())

    def learn(self, parent: str, spec: LayoutSpec) -> None:
        self._specs.put(parent, spec)


class Begun:
    """The chunk size of the uploads begun here and not yet committed, the newest last:
    a commit checks its checksum count against it without asking the store (the store's
    commit is the authority on whether the upload is still there)."""

    def __init__(self, kept: int = BEGUN_KEPT) -> None:
        self._sizes: Bounded[str, int] = Bounded(kept)

    def add(self, uploads: Sequence[Upload]) -> None:
        for upload in uploads:      # one begun again keeps its place: the first begin's
            self._sizes[upload.file_id] = upload.layout.chunk_size
        self._sizes.trim()

    def take(self, file_id: str) -> int | None:
        return self._sizes.pop(file_id, None)


def check_commit(chunk_size: int, size: int, checksums: Sequence[int]) -> None:
    """What a commit of an upload in chunks of ``chunk_size`` must satisfy: a size, and
    one checksum per chunk of it."""
    if size < 0:
        raise BadRequest("size must not be negative")
    expected = -(-size // chunk_size)
    if len(checksums) != expected:
        raise BadRequest(f"a {size}-byte file has {expected} chunks, "
                         f"got {len(checksums)} checksums")


async def create(service: MetaService, items: Sequence[CreateItem]
                 ) -> list[Created | StagerError]:
    """Begin a write of each item: its upload and a FileInfo with layout and locations
    (a retry with the same idempotency key answers the upload its first try began)."""
    created, fresh = await plan(service, items)
    await begin(service, fresh)
    return created


async def begin(service: MetaService, uploads: Sequence[Upload]) -> None:
    """Record uploads :func:`plan` made (none: nothing to do)."""
    if uploads:
        await service.store.begin_uploads(uploads)


def plan_hinted(service: MetaService, item: CreateItem, size: int) -> Created | None:
    """:func:`plan` of one new upload of ``size`` bytes without the check of its path
    (a store round trip): its layout from the spec :class:`SpecHints` has for its
    directory, which the upload carries (``Upload.spec``) for the store that records it
    to check, with everything else the check did (see
    :func:`stager.meta.store.spec.checked_spec`).  None where the file would not fit
    one chunk of that layout (its record would not wait for its commit: it is checked)."""
    if item.path == "/":
        raise IsADirectory("the root is a directory", path=item.path)
    if item.layout is not None:
        item.layout.validate(service.config.max_chunk_size)
    hint = service.spec_hints.get(paths.split(item.path)[0])
    upload = new_upload(service, item.path, (item.layout or LayoutSpec()).merged_over(hint),
                        overwrite=item.overwrite, parents=item.parents,
                        healthy=service.placeable_targets(), checked_by_store=hint)
    if size > upload.layout.chunk_size:
        return None
    service.begun.add([upload])
    return upload, service.info(NodeEntry(upload.path, "file", 0, upload.created,
                                          upload.file_id, upload.layout))


async def plan(service: MetaService, items: Sequence[CreateItem], *, again: bool = False
               ) -> tuple[list[Created | StagerError], list[Upload]]:
    """:func:`create` without recording the new uploads: what it answers, and the
    uploads still to :func:`begin` before their commit and before any reroute of
    their chunks.  A writer in this server begins them while their first chunks
    are on their way (:class:`~stager.meta.http.gateway.Gateway`): the record
    does not wait for the data, nor the data for it.  ``again``: a write planned once
    more after its store refused a :func:`plan_hinted` (its first id is not reused: that
    try's chunks may lie on other targets, unrecorded)."""
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
        (items[i].path, items[i].overwrite, items[i].parents) for i in todo]) if todo else []
    for i, spec in zip(todo, inherited, strict=True):
        if isinstance(spec, LayoutSpec):
            service.spec_hints.learn(paths.split(items[i].path)[0], spec)
    uploads = _plan_uploads(service, items, todo, inherited, results, again)
    # a retry: the uploads the first try began are answered, not begun again
    earlier = await opkey.earlier_uploads(service.store, [u.file_id for _, u in uploads])
    uploads = [(i, earlier.get(u.file_id, u)) for i, u in uploads]
    fresh = [u for _, u in uploads if u.file_id not in earlier]
    service.begun.add([u for _, u in uploads])
    for i, upload in uploads:
        results[i] = (upload, service.info(NodeEntry(upload.path, "file", 0, upload.created,
                                                     upload.file_id, upload.layout)))
    return _filled(results), fresh


def _plan_uploads(service: MetaService, items: Sequence[CreateItem], todo: list[int],
                  inherited: list[LayoutSpec | StagerError],
                  results: list[Any], again: bool) -> list[tuple[int, Upload]]:
    """Each file's new upload: its id and its layout, chosen once among the targets a
    new layout may name now."""
    healthy = service.placeable_targets()
    uploads = []
    for i, spec in zip(todo, inherited, strict=True):
        if isinstance(spec, StagerError):
            results[i] = spec
            continue
        item = items[i]
        try:
            upload = new_upload(service, item.path, (item.layout or LayoutSpec()).merged_over(spec),
                                overwrite=item.overwrite, parents=item.parents, healthy=healthy,
                                again=again)
        except StagerError as exc:
            results[i] = exc
            continue
        uploads.append((i, upload))
    return uploads


def new_upload(service: MetaService, path: str, spec: LayoutSpec, *, overwrite: bool,
               parents: bool, healthy: Sequence[TargetInfo], again: bool = False,
               checked_by_store: LayoutSpec | None = None) -> Upload:
    """A new file id at ``path`` and its layout among ``healthy`` targets (the up ones,
    suspect ones where too few are up: :func:`choose_layout`): ``spec`` (the request's,
    over the nearest directory's), then the configured defaults.  ``checked_by_store``:
    the directory's spec assumed, for its store to check (``Upload.spec``)."""
    config = service.config
    spec = spec.merged_over(LayoutSpec(config.chunk_size, config.stripe_count,
                                       config.replicas))
    file_id = opkey.new_file_id(path + "\0again" if again else path)
    chosen = choose_layout(
        healthy, chunk_size=spec.chunk_size or config.chunk_size,
        stripe_count=spec.stripe_count or 0, replicas=spec.replicas or 1,
        max_stripe_count=config.max_stripe_count, start=int(file_id[:8], 16))
    return Upload(file_id, path, chosen, overwrite, parents, service.clock(),
                  spec=checked_by_store)


async def commit(service: MetaService, items: Sequence[CommitItem]
                 ) -> list[FileInfo | StagerError]:
    """Make each upload visible, with its attributes, in one transaction; failed items
    change nothing.  An upload found gone answers the file an earlier try committed
    (:mod:`.opkey`)."""
    check_count(len(items))
    sizes = await _chunk_sizes(service, [i.file_id for i in items])
    results: list[NodeEntry | StagerError | None] = [None] * len(items)
    todo = []
    for i, (item, chunk_size) in enumerate(zip(items, sizes, strict=True)):
        try:
            if isinstance(chunk_size, StagerError):
                raise chunk_size
            check_commit(chunk_size, item.size, item.checksums)
        except StagerError as exc:
            results[i] = exc
            continue
        todo.append(i)
    # cached (re-fetchable) bytes go first where a quota would refuse a commit
    await service.quotas.make_room([(items[i].file_id, items[i].size) for i in todo])
    now = service.clock()
    entries = await service.store.commit_uploads([
        (items[i].file_id, items[i].size, items[i].checksums, items[i].mtime or now,
         items[i].attrs) for i in todo], now=now) if todo else []
    for i, entry in zip(todo, entries, strict=True):
        results[i] = entry
    return [await _committed(service, item.file_id, result)
            for item, result in zip(items, _filled(results), strict=True)]


async def _chunk_sizes(service: MetaService, file_ids: Sequence[str]
                       ) -> list[int | StagerError]:
    """Each upload's chunk size: from :class:`Begun` where this server began it, else
    from the store (UploadNotFound in its place where it is gone)."""
    sizes: list[int | StagerError | None] = [service.begun.take(f) for f in file_ids]
    unknown = [i for i, size in enumerate(sizes) if size is None]
    if unknown:
        found = await service.store.get_uploads([file_ids[i] for i in unknown])
        for i, upload in zip(unknown, found, strict=True):
            sizes[i] = upload.layout.chunk_size if isinstance(upload, Upload) else upload
    return _filled(sizes)


async def _committed(service: MetaService, file_id: str, result: NodeEntry | StagerError
                     ) -> FileInfo | StagerError:
    """What the commit of ``file_id`` answers: the file, or its error; an upload gone
    was maybe committed by an earlier try of this request (:func:`.opkey.after_gone`).
    A store that fails meanwhile fails the whole request (503: the client asks again)."""
    if isinstance(result, UploadNotFound):
        try:
            result = await opkey.after_gone(service.store, file_id, result)
        except UploadNotFound as exc:
            return exc
    return result if isinstance(result, StagerError) else service.info(result)


async def abort(service: MetaService, file_ids: Sequence[str]) -> list[StagerError | None]:
    """Abandon each upload (its chunks are collected); ``None`` where it went."""
    check_count(len(file_ids))
    for file_id in file_ids:
        service.begun.take(file_id)
    if not file_ids:
        return []
    return await service.store.abort_uploads(file_ids, now=service.clock())


def _filled(results: list[Any]) -> list[Any]:
    assert all(r is not None for r in results)
    return results
