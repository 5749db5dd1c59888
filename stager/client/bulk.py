"""Writing many small files at once: :meth:`AsyncClient.write_many`.

A batch of files (up to :data:`~stager.protocol.batch.MAX_BATCH_ITEMS`) costs one
create request (one transaction) for them all; their chunks as one plan for the
write engine (:mod:`stager.dataplane.writeengine`, the streaming writer's too:
grouped per target into chunk batches of at most :data:`CHUNK_BATCH_BYTES`, a
target that fails routed around); one commit for the files whose chunks are all
stored and one abort for the others.  Each file is visible whole or not at all;
one that failed in a way worth writing again is written again (:mod:`.rewrite`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..dataplane.writeengine import CHUNK_BATCH_BYTES, WriteEngine, WriteOptions
from ..dataplane.writeplan import Placement, WritePlan, cut
from ..errors import StagerError, Unavailable, UploadNotFound
from ..protocol import paths
from ..protocol.batch import MAX_BATCH_ITEMS, CommitItem, CreateItem, batch_body, read_results
from ..protocol.messages import Upload
from ..protocol.models import FileInfo, Layout, LayoutSpec
from ..protocol.routes import route
from .rewrite import backoff, worth_writing_again

if TYPE_CHECKING:
    from .async_client import AsyncClient

Result = FileInfo | StagerError


@dataclass(frozen=True)
class WriteItem:
    """One file for :meth:`AsyncClient.write_many`: its path, bytes and mtime."""

    path: str
    data: bytes | bytearray | memoryview
    mtime: float | None = None


def as_item(obj: WriteItem | tuple[Any, ...]) -> WriteItem:
    """A :class:`WriteItem` from itself or from ``(path, data[, mtime])``."""
    return obj if isinstance(obj, WriteItem) else WriteItem(*obj)


@dataclass
class _Upload:
    index: int                       # in the batch
    file_id: str
    layout: Layout
    locations: dict[str, str]
    checksums: list[int] = field(default_factory=list)


async def write_many(client: AsyncClient, items: Iterable[WriteItem | tuple[Any, ...]], *,
                     layout: LayoutSpec | None = None, overwrite: bool = True
                     ) -> list[Result]:
    """Write every item; per item, the committed file's info or the error that kept
    it from being written (nothing of it is visible then)."""
    todo = [as_item(i) for i in items]
    out: list[Result] = []
    for start in range(0, len(todo), MAX_BATCH_ITEMS):
        out += await _with_retries(client, todo[start:start + MAX_BATCH_ITEMS], layout,
                                   overwrite)
    return out


async def _with_retries(client: AsyncClient, items: list[WriteItem],
                        layout: LayoutSpec | None, overwrite: bool) -> list[Result]:
    """Write the batch; again (the one policy and backoff: :mod:`.rewrite`) the items
    worth writing again, and the whole batch if the metadata server was unreachable
    (a batch that raised may have been committed in part: writing it again is an
    overwrite)."""
    retries = client.config.write_retries if overwrite else 0
    results: list[Result | None] = [None] * len(items)
    todo = list(range(len(items)))
    for attempt in range(retries + 1):
        if attempt:
            await asyncio.sleep(backoff(attempt))
        try:
            got = await _write_batch(client, [items[i] for i in todo], layout, overwrite)
        except Unavailable as exc:
            if attempt == retries or not worth_writing_again(exc):
                raise
            continue
        for i, r in zip(todo, got, strict=True):
            results[i] = r
        todo = [i for i, r in zip(todo, got, strict=True) if worth_writing_again(r)]
        if not todo:
            break
    return results  # type: ignore[return-value]    # every item answered


async def _write_batch(client: AsyncClient, items: Sequence[WriteItem],
                       layout: LayoutSpec | None, overwrite: bool) -> list[Result]:
    results: list[Result | None] = [None] * len(items)
    uploads = await _create(client, items, layout, overwrite, results)
    try:
        failed = await _put_chunks(client, items, uploads)
        for up in uploads:
            if up.index in failed:
                results[up.index] = failed[up.index]
        await _commit(client, items, [u for u in uploads if u.index not in failed], results)
    except BaseException:
        # Cancelled or the metadata server went away: nothing was answered for these.
        pending = [u.file_id for u in uploads if results[u.index] is None]
        await asyncio.shield(_abort(client, pending))
        raise
    await _abort(client, [u.file_id for u in uploads if u.index in failed])
    client.meta.forget(*(items[u.index].path for u in uploads))
    assert all(r is not None for r in results)
    return results  # type: ignore[return-value]


async def _create(client: AsyncClient, items: Sequence[WriteItem],
                  layout: LayoutSpec | None, overwrite: bool,
                  results: list[Result | None]) -> list[_Upload]:
    body = batch_body([CreateItem(paths.normalize(i.path), layout, overwrite).to_json()
                       for i in items])
    answer = await client.meta.request(route("create"), body=body)
    uploads = []
    for index, got in enumerate(read_results(answer, Upload.from_json)):
        if isinstance(got, StagerError):
            results[index] = got
        else:
            client.learn("write", got.file_id, got.capability)
            uploads.append(_Upload(index, got.file_id, got.layout, got.locations))
    return uploads


async def _put_chunks(client: AsyncClient, items: Sequence[WriteItem],
                      uploads: list[_Upload]) -> dict[int, StagerError]:
    """Every chunk of every upload on each of its replicas, as one plan run by the
    write engine (:mod:`stager.dataplane.writeengine`: chunk batches per target, a
    target that fails routed around for every upload it holds); the files that
    failed.  Each stored upload's checksums are filled in."""
    plan = WritePlan()
    plan.add_uploads([Placement(u.file_id, u.layout, u.locations) for u in uploads])
    pieces = [cut(items[u.index].data, u.layout.chunk_size) for u in uploads]
    rows = plan.add([k for k, p in enumerate(pieces) for _ in p],
                    [i for p in pieces for i in range(len(p))], [c for p in pieces for c in p])
    await WriteEngine(client.plane, plan, client.limit, reroute=client.reroute,
                      options=WriteOptions(batch_bytes=CHUNK_BATCH_BYTES)).store(rows)
    for up, checksums in zip(uploads, plan.checksums(), strict=True):
        up.checksums = list(checksums)
    return {up.index: p.error for up, p in zip(uploads, plan.uploads, strict=True)
            if p.error is not None}


async def _commit(client: AsyncClient, items: Sequence[WriteItem], uploads: list[_Upload],
                  results: list[Result | None]) -> None:
    if not uploads:
        return
    body = batch_body([CommitItem(u.file_id, memoryview(items[u.index].data).nbytes,
                                  tuple(u.checksums), items[u.index].mtime).to_json()
                       for u in uploads])
    # The chunks are stored: a commit whose outcome is unknown is asked again, not the
    # files written afresh (which could apply them twice, over a later writer's).
    answer = await client.meta.request(route("commit"), body=body,
                                       settle=client.config.write_retries)
    for up, got in zip(uploads, read_results(answer, FileInfo.from_json), strict=True):
        results[up.index] = upload_gone(up.file_id, got) \
            if isinstance(got, UploadNotFound) else got


def upload_gone(file_id: str, got: UploadNotFound) -> UploadNotFound:
    """A commit of our own upload found it gone: ``got`` as the server said it where
    ``never_committed`` (the bytes may be sent again), else settled.  Then its first
    try's answer was lost and the commit was asked again: it was done then, and the
    file since replaced or removed by another writer (or the upload outlived
    ``upload_grace`` and was collected)."""
    if got.details.get("never_committed"):
        return got
    return UploadNotFound(
        f"upload {file_id} is gone: committed by a try whose answer was lost, then "
        "replaced or removed by another writer (or expired); not written again",
        file_id=file_id, settled=True)


async def _abort(client: AsyncClient, file_ids: list[str]) -> None:
    if not file_ids:
        return
    try:
        await client.meta.request(route("abort"), body=batch_body(file_ids, name="file_ids"))
    except StagerError:
        pass  # the server collects abandoned uploads itself after upload_grace
