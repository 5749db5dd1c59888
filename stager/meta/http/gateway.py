"""Whole files for plain HTTP clients, over the same striped data path as the client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from ...config import Config
from ...dataplane import DataPlane, StripedReader, StripedWriter
from ...dataplane.writeplan import Placement
from ...errors import PayloadTooLarge, StagerError, UploadNotFound
from ...protocol import paths
from ...protocol.batch import CommitItem, CreateItem, one
from ...protocol.messages import RerouteItem, RerouteRequest
from ...protocol.models import FileInfo, LayoutSpec
from .. import opkey, writes
from ..service import MetaService
from ..store.base import Upload
from ..store.spec import SpecChanged
from ..writes import Created


class Gateway:
    def __init__(self, service: MetaService, plane: DataPlane, config: Config) -> None:
        self.service = service
        self.plane = plane
        self.config = config
        self.limit = asyncio.Semaphore(config.client_concurrency)

    def reader(self, info: FileInfo) -> StripedReader:
        return StripedReader(self.plane, info, concurrency=self.limit,
                             readahead=self.config.readahead_chunks, retries=self.config.retries)

    async def write(self, path: str, body: AsyncIterator[bytes] | bytes, *,
                    layout: LayoutSpec | None = None, max_size: int,
                    size: int | None = None) -> FileInfo:
        """Store ``body`` at ``path``; visible only once every chunk is durable.  The
        upload is recorded while the chunks are written (each waits on its own disk,
        at once); the commit, and any reroute of a chunk, wait for the record.  A body
        of a known ``size`` that fits one chunk (a small file) is recorded only once
        its chunk is stored, in the transaction of its commit (see :class:`_Record`);
        on a store that runs the two as one statement, a first try of one is planned
        without the check of its path (:func:`.writes.plan_hinted`): its store checks
        it in that statement, and where the directory's layout spec was not the one
        assumed, it is planned (checked) and written once more, from its bytes kept.
        ``body`` may be the whole body at once (``bytes``: a small one, read whole):
        nothing to keep then, and no iterator to step through."""
        item = CreateItem(path, layout)
        hinted = None
        if self.service.store.in_order and size is not None and not opkey.retried():
            hinted = writes.plan_hinted(self.service, item, size)
        if hinted is None:
            created, fresh = await self.service.plan_creates([item])
            return await self._write(one(created), fresh, body, max_size=max_size, size=size)
        kept: list[bytes] = []

        async def keeping(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
            async for piece in body:
                kept.append(piece)
                yield piece

        try:
            return await self._write(hinted, [hinted[0]],
                                     body if isinstance(body, bytes) else keeping(body),
                                     max_size=max_size, size=size)
        except SpecChanged as exc:
            self.service.spec_hints.learn(paths.split(path)[0], exc.spec)
        created, fresh = await writes.plan(self.service, [item], again=True)
        return await self._write(one(created), fresh,
                                 body if isinstance(body, bytes) else _replay(kept),
                                 max_size=max_size, size=size)

    async def _write(self, created: Created, fresh: Sequence[Upload],
                     body: AsyncIterator[bytes] | bytes, *, max_size: int, size: int | None
                     ) -> FileInfo:
        """:meth:`write` of a planned upload."""
        upload, info = created
        assert info.layout is not None
        if fresh and opkey.retried():
            done = await self._done_before(upload.file_id)
            if done is not None:
                return done
        record = _Record(self.service, fresh, later=self.service.store.in_order
                         and size is not None and size <= info.layout.chunk_size)

        async def reroute(target: str, cause: StagerError, items: Sequence[RerouteItem]
                          ) -> list[Placement | StagerError]:
            await asyncio.shield(record.started())
            return await self._reroute(target, cause, items)

        writer = StripedWriter(self.plane, upload.file_id, info.layout, info.locations,
                               max_in_flight=self.config.readahead_chunks, reroute=reroute)
        try:
            if isinstance(body, bytes):
                await _write_piece(writer, body, max_size)
            else:
                async for piece in body:
                    await _write_piece(writer, piece, max_size)
            written, checksums = await writer.close()
            return await self._commit(record, CommitItem(upload.file_id, written,
                                                         tuple(checksums)))
        except BaseException as exc:
            await writer.abort()
            if isinstance(exc, SpecChanged):    # nothing recorded: written again (write)
                raise
            if opkey.keyed() and not _final(exc):
                # Its client sends it again (a 5xx, a broken connection): the upload
                # stays for that retry, which finds it (plan), or is collected after
                # upload_grace.  Abandoned, its id (the key's) would be retired, and
                # the retry refused as a file committed and then replaced.
                raise
            await asyncio.shield(self._abort(upload.file_id, record.started()))
            raise

    async def _commit(self, record: _Record, item: CommitItem) -> FileInfo:
        """Commit once the upload is recorded; a record left for later is made now,
        and the commit right behind it (the store runs it first: one transaction)."""
        if not record.waiting:
            await asyncio.shield(record.started())
            return one(await self.service.commit([item]))
        begun = record.started()
        committed = asyncio.ensure_future(self.service.commit([item]))
        try:
            await asyncio.shield(begun)
        except BaseException:
            committed.add_done_callback(_outcome_seen)
            raise
        return one(await committed)

    async def _done_before(self, file_id: str) -> FileInfo | None:
        """On a retry whose earlier try left no upload: the file that try committed
        (its answer was never recorded: the server died in between), else None (no
        try got that far).  Written again under the same id, it would replace itself,
        and the collection of the replaced id would take the new file's chunks; one
        committed and then replaced or removed since is not written again over what
        is there now (``settled``)."""
        done = await opkey.earlier_commit(self.service.store, file_id)
        if done is not None:
            return self.service.info(done)
        if await self.service.store.retired(file_id):
            raise UploadNotFound(f"file {file_id} was committed, then replaced or removed by "
                                 "another writer; not written again", file_id=file_id,
                                 settled=True)
        return None

    async def _reroute(self, target: str, cause: StagerError, items: Sequence[RerouteItem]
                       ) -> list[Placement | StagerError]:
        """The write engine's reroute, on this server's own service (once the upload is
        recorded: a reroute changes its layout)."""
        answers = await self.service.reroute(RerouteRequest(target, cause.code, cause.message,
                                                            tuple(items)))
        return [got if isinstance(got, StagerError)
                else Placement(got[0].file_id, got[0].layout, dict(got[1].locations))
                for got in answers]

    async def _abort(self, file_id: str, begun: asyncio.Future[None]) -> None:
        """Abandon the upload once its record is done (an abort before it would leave
        the record behind); a record that failed left nothing to abandon."""
        try:
            await begun
        except Exception:
            return
        # an error in its place: already committed or collected
        await self.service.abort([file_id])


async def _write_piece(writer: StripedWriter, piece: bytes, max_size: int) -> None:
    """One piece of a body into ``writer``, unless it takes the body past ``max_size``
    (an empty one writes nothing, as an empty body's iterator yields nothing)."""
    if writer.size + len(piece) > max_size:
        raise PayloadTooLarge(f"body over the limit of {max_size} bytes", limit=max_size)
    if piece:
        await writer.write(piece)


async def _replay(pieces: list[bytes]) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


def _final(exc: BaseException) -> bool:
    """A failure no retry of the same request mends: the request's own fault (4xx)."""
    return isinstance(exc, StagerError) and exc.status < 500


class _Record:
    """The record of a write's new uploads (:meth:`MetaService.begin_uploads`): begun
    at once, so that it is in the store while the chunks go out, or (``later``) only
    when something needs it: a reroute (it changes the upload's layout), an abort, or
    the commit, which is then made right behind it, on a store that runs its calls in
    order (``in_order``: SQLite's thread; PostgreSQL's write groups, which run the two
    as one statement), so that the two share one transaction.  A
    small file's put then makes one store write, not two.  A server that dies after
    storing such a file's chunk and before its commit leaves that chunk unrecorded:
    an orphan that fsck deletes after ``orphan_grace``, where a recorded upload is
    collected after ``upload_grace`` (both an hour)."""

    def __init__(self, service: MetaService, uploads: Sequence[Upload], *, later: bool) -> None:
        self.service, self.uploads = service, uploads
        self._task: asyncio.Future[None] | None = None
        if not later:
            self.started()

    @property
    def waiting(self) -> bool:
        """Not begun yet (left for later, and nothing needed it so far)."""
        return self._task is None

    def started(self) -> asyncio.Future[None]:
        if self._task is None:
            self._task = asyncio.ensure_future(self.service.begin_uploads(self.uploads))
        return self._task


def _outcome_seen(task: asyncio.Future[object]) -> None:
    """A commit queued behind a record that failed fails too (its upload is not
    there); its error is the record's, already raised."""
    if not task.cancelled():
        task.exception()
