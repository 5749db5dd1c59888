"""Striped writes: cut a stream into chunks and hand each to the write engine.

The writer cuts and keeps a window: at most ``max_in_flight`` chunks are being
stored at once, each by its own call of the one executor ``write_many`` uses too
(:mod:`.writeengine`), on a plan of one upload.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import numpy as np

from ..aio import cancel_and_wait
from ..checksum import crc32c
from ..errors import StagerError
from ..layout import chunk_targets
from ..protocol.models import Layout, chunk_id
from .transport import DataPlane
from .writeengine import Reroute, WriteEngine, WriteOptions, put_copy, to_route_around
from .writeplan import Placement, WritePlan

# Chunk buffers whose chunk is stored (every PUT from it answered), by size, for the
# next writer of this process to fill: the gateway makes a writer per part, and a new
# buffer is zero-filled and faulted in (bytearray(n): 0.1-0.5 CPU s a GiB).
_SPARE: dict[int, list[bytearray]] = {}
SPARE_BYTES = 32 << 20      # kept per chunk size, at most


def _take(size: int) -> bytearray:
    try:
        return _SPARE[size].pop()
    except (KeyError, IndexError):
        return bytearray(size)


def _keep(buf: bytearray) -> None:
    spare = _SPARE.setdefault(len(buf), [])
    if len(buf) * (len(spare) + 1) <= SPARE_BYTES:
        spare.append(buf)


class StripedWriter:
    """Accepts bytes in any sizes; stores each full chunk on every replica.

    ``write`` waits while ``max_in_flight`` chunks are out, so memory stays near
    ``max_in_flight × chunk_size``.  A chunk counts once every replica its layout
    names proved it stored (:mod:`.ack`).  ``reroute`` is the engine's, for a batch
    of one upload (:mod:`.writeengine`); without it, a failed chunk write fails the
    writer.  The plan and its engine are made for the first chunk sent, but for a
    lone chunk of one copy (a small file's), which goes out without them
    (:meth:`_store_alone`).
    """

    def __init__(self, plane: DataPlane, file_id: str, layout: Layout,
                 locations: Mapping[str, str], *, max_in_flight: int = 8,
                 reroute: Reroute | None = None, first_chunk: int = 0) -> None:
        self.file_id = file_id
        self.first_chunk = first_chunk      # the index of the first chunk written (a part)
        self.max_in_flight = max(1, max_in_flight)
        self.size = 0
        self.upload = Placement(file_id, layout, dict(locations))
        self.plane, self.reroute = plane, reroute
        self.options = WriteOptions(copy_bytes=self.max_in_flight * layout.chunk_size)
        self._engine: WriteEngine | None = None     # made when first needed (engine)
        self._alone: tuple[int, ...] = ()           # the CRC32C of a chunk stored alone
        self._chunk = layout.chunk_size
        self._buf: bytearray | None = None  # the chunk being filled, taken when needed
        self._fill = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def plan(self) -> WritePlan:
        return self.engine.plan

    @property
    def engine(self) -> WriteEngine:
        """The engine, on a plan of this writer's one upload (made at its first use)."""
        if self._engine is None:
            plan = WritePlan()
            plan.add_uploads([self.upload])
            # the window's every replica at once; as many chunks read back after a reroute
            limit = asyncio.Semaphore(self.max_in_flight * max(1, self.upload.layout.replicas))
            self._engine = WriteEngine(self.plane, plan, limit, options=self.options,
                                       reroute=self.reroute)
        return self._engine

    # The upload's, as the plan keeps them (``locations`` may be replaced).
    layout = property(lambda self: self.upload.layout)
    rerouted = property(lambda self: self.upload.rerouted)     # targets routed around
    locations = property(lambda self: self.upload.locations,
                         lambda self, value: setattr(self.upload, "locations", value))

    async def write(self, data: bytes | bytearray | memoryview,
                    release: Callable[[], None] | None = None) -> int:
        """Write ``data``.  Its whole chunks at a chunk boundary go out from ``data``
        itself, not a copy, where it is immutable ``bytes`` or comes with ``release``,
        which is called once nothing uses ``data`` any more (every PUT from it
        answered, failed or was cancelled), so that the caller can reuse it."""
        if self._closed:
            raise ValueError("write to a closed writer")
        view = memoryview(data).cast("B")
        total, chunk = len(view), self._chunk
        holders = 1         # this call, and each chunk sent from ``data``

        def let_go(_: object = None) -> None:
            nonlocal holders
            holders -= 1
            if holders == 0 and release is not None:
                release()

        try:
            while view:
                if not self._fill and len(view) >= chunk and (
                        release is not None or isinstance(data, bytes)):
                    await self._send(view[:chunk], let_go)
                    holders += 1        # no await since the task began: it is not done
                    view = view[chunk:]
                    self.size += chunk
                    continue
                n = min(len(view), chunk - self._fill)
                if self._buf is None:
                    self._buf = _take(chunk)
                self._buf[self._fill:self._fill + n] = view[:n]
                self._fill += n
                self.size += n
                view = view[n:]
                if self._fill == chunk:
                    await self._send_buffer()
        finally:
            let_go()
        return total

    async def write_owned(self, data: memoryview, release: Callable[[], None]) -> int:
        """:meth:`write` of a buffer the caller reuses after ``release()``."""
        return await self.write(data, release)

    async def close(self) -> tuple[int, tuple[int, ...]]:
        """Send what is buffered, wait for every chunk; returns (size, checksums)."""
        if not self._closed:
            if self._fill and not self._tasks:
                await self._store_last()
            elif self._fill:
                await self._send_buffer()
            self._closed = True
            await self.flush()
        return self.size, self._alone if self._engine is None else self.plan.checksums()[0]

    async def _store_last(self) -> None:
        """Store the buffered chunk, the only one out (a small file's whole body), here
        rather than by a task that :meth:`flush` then waits for."""
        buf = self._buf
        assert buf is not None
        data = memoryview(buf)[:self._fill]
        self._buf, self._fill = None, 0
        if self._engine is None and self.layout.replicas == 1:
            await self._store_alone(data)
        else:
            await self._store(self.plan.add([0], [self.first_chunk + self.plan.n], [data]))
        _keep(buf)      # not after a failure or a cancel, as in _send_buffer

    async def _store_alone(self, data: memoryview) -> None:
        """Store the first chunk, of one copy, with one request and no plan (for a small
        file, making the plan cost more than the request).  A failure the engine would
        route around goes to it, with the target as one of its own requests reports
        it: routed around, not tried again."""
        crc = crc32c(data)
        target = chunk_targets(self.layout, self.first_chunk)[0]
        url = self.locations.get(target)
        try:
            await put_copy(self.plane, target, url, chunk_id(self.file_id, self.first_chunk),
                           data, crc, self.options)
        except StagerError as exc:
            if not to_route_around(exc, url, self.reroute):
                raise
            await self._store(self.plan.add([0], [self.first_chunk], [data]), {target: exc})
        else:
            self._alone = (crc,)

    async def flush(self) -> None:
        """Wait until every whole chunk written so far is stored on all its replicas
        (a partial chunk stays buffered until more bytes or :meth:`close`)."""
        while self._tasks:
            await self._wait_one()

    async def abort(self) -> None:
        self._closed = True
        await cancel_and_wait(self._tasks)
        self._tasks.clear()

    async def _send_buffer(self) -> None:
        buf = self._buf
        assert buf is not None
        data = memoryview(buf)[:self._fill]
        self._buf, self._fill = None, 0

        def reuse(task: asyncio.Task[None]) -> None:
            # not after a failure or a cancel: a request may still be sending from it
            if not task.cancelled() and task.exception() is None:
                _keep(buf)

        await self._send(data, reuse)

    async def _send(self, data: memoryview,
                    on_done: Callable[[asyncio.Task[None]], None] | None = None) -> None:
        """Hand the next chunk to the engine once fewer than ``max_in_flight`` are
        out; ``on_done`` is called when it is stored, however that ended."""
        while len(self._tasks) >= self.max_in_flight:
            await self._wait_one()
        rows = self.plan.add([0], [self.first_chunk + self.plan.n], [data])
        task = asyncio.ensure_future(self._store(rows))
        if on_done is not None:
            task.add_done_callback(on_done)
        self._tasks.add(task)

    async def _store(self, rows: np.ndarray,
                     broken: dict[str, StagerError] | None = None) -> None:
        await self.engine.store(rows, broken=broken)
        if self.upload.error is not None:
            raise self.upload.error

    async def _wait_one(self) -> None:
        done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            self._tasks.discard(task)
            exc = task.exception()
            if exc is not None:
                await self.abort()
                raise exc

