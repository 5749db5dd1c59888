"""Whole files for plain HTTP clients, over the same striped data path as the client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from ...config import Config
from ...dataplane import DataPlane, StripedReader, StripedWriter
from ...dataplane.writeplan import Placement
from ...errors import PayloadTooLarge, StagerError, UploadNotFound
from ...protocol.batch import CommitItem, CreateItem, one
from ...protocol.messages import RerouteItem, RerouteRequest
from ...protocol.models import FileInfo, LayoutSpec
from .. import opkey
from ..service import MetaService


class Gateway:
    def __init__(self, service: MetaService, plane: DataPlane, config: Config) -> None:
        self.service = service
        self.plane = plane
        self.config = config
        self.limit = asyncio.Semaphore(config.client_concurrency)

    def reader(self, info: FileInfo) -> StripedReader:
        return StripedReader(self.plane, info, concurrency=self.limit,
                             readahead=self.config.readahead_chunks, retries=self.config.retries)

    async def write(self, path: str, body: AsyncIterator[bytes], *,
                    layout: LayoutSpec | None = None, max_size: int) -> FileInfo:
        """Store ``body`` at ``path``; visible only once every chunk is durable.  The
        upload is recorded while the chunks are written (a small file's one chunk
        and the record each wait on their own disk, at once); the commit, and any
        reroute of a chunk, wait for the record."""
        created, fresh = await self.service.plan_creates([CreateItem(path, layout)])
        upload, info = one(created)
        assert info.layout is not None
        if fresh and opkey.retried():
            done = await self._done_before(upload.file_id)
            if done is not None:
                return done
        begun = asyncio.ensure_future(self.service.begin_uploads(fresh))

        async def reroute(target: str, cause: StagerError, items: Sequence[RerouteItem]
                          ) -> list[Placement | StagerError]:
            await asyncio.shield(begun)
            return await self._reroute(target, cause, items)

        writer = StripedWriter(self.plane, upload.file_id, info.layout, info.locations,
                               max_in_flight=self.config.readahead_chunks, reroute=reroute)
        try:
            async for piece in body:
                if writer.size + len(piece) > max_size:
                    raise PayloadTooLarge(f"body over the limit of {max_size} bytes",
                                          limit=max_size)
                await writer.write(piece)
            size, checksums = await writer.close()
            await asyncio.shield(begun)
            return one(await self.service.commit([CommitItem(upload.file_id, size,
                                                             tuple(checksums))]))
        except BaseException:
            await writer.abort()
            await asyncio.shield(self._abort(upload.file_id, begun))
            raise

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
