"""Striped writes: cut a stream into chunks and store each on all its replicas in parallel."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from ..aio import cancel_and_wait, gather_or_cancel
from ..checksum import crc32c
from ..layout import chunk_targets
from ..protocol.models import Layout, chunk_id
from .transport import DataPlane, unknown_target


class StripedWriter:
    """Accepts bytes in any sizes; PUTs each full chunk to every replica.

    At most ``max_in_flight`` chunks are being sent at once; ``write`` waits
    when the window is full, so memory stays near ``max_in_flight × chunk_size``.
    A chunk counts as written only when every replica answered 2xx (durable).
    """

    def __init__(self, plane: DataPlane, file_id: str, layout: Layout,
                 locations: Mapping[str, str], *, max_in_flight: int = 8) -> None:
        self.plane = plane
        self.file_id = file_id
        self.layout = layout
        self.locations = dict(locations)
        self.max_in_flight = max(1, max_in_flight)
        self.size = 0
        self._index = 0
        self._buf = bytearray(layout.chunk_size)
        self._fill = 0
        self._checksums: dict[int, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    async def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._closed:
            raise ValueError("write to a closed writer")
        view = memoryview(data).cast("B")
        total = len(view)
        chunk = len(self._buf)
        while view:
            if not self._fill and len(view) >= chunk and isinstance(data, bytes):
                # Whole chunks of immutable bytes go out as they are: no copy.
                await self._send(view[:chunk])
                view = view[chunk:]
                continue
            n = min(len(view), len(self._buf) - self._fill)
            self._buf[self._fill:self._fill + n] = view[:n]
            self._fill += n
            view = view[n:]
            if self._fill == len(self._buf):
                await self._send_buffer()
        self.size += total
        return total

    async def write_owned(self, data: memoryview, release: Callable[[], None]) -> int:
        """Write ``data``, sending its whole chunks from ``data`` itself, not a copy.

        ``release()`` is called once nothing uses ``data`` any more: every PUT
        sent from it answered, failed or was cancelled (also when the writer is
        aborted), so the caller can reuse the buffer.  Only whole chunks at a
        chunk boundary go out this way; a partial chunk (the end of a file) is
        copied, as :meth:`write` does.
        """
        if self._closed:
            raise ValueError("write to a closed writer")
        chunk = len(self._buf)
        view = memoryview(data).cast("B")
        whole = 0 if self._fill else len(view) // chunk * chunk
        holders = 1 + whole // chunk         # this call, and each PUT sent from ``data``

        def let_go(_: object = None) -> None:
            nonlocal holders
            holders -= 1
            if holders == 0:
                release()

        sent = 0
        try:
            for pos in range(0, whole, chunk):
                await self._send(view[pos:pos + chunk], let_go)
                sent += 1
                self.size += chunk
            if whole < len(view):
                await self.write(view[whole:])
        finally:
            for _ in range(whole // chunk - sent + 1):     # PUTs never sent, and this call
                let_go()
        return len(view)

    async def close(self) -> tuple[int, tuple[int, ...]]:
        """Send what is buffered, wait for every chunk; returns (size, checksums)."""
        if not self._closed:
            if self._fill:
                await self._send_buffer()
            self._closed = True
            while self._tasks:
                await self._wait_one()
        return self.size, tuple(self._checksums[i] for i in range(self._index))

    async def abort(self) -> None:
        self._closed = True
        await cancel_and_wait(self._tasks)
        self._tasks.clear()

    async def _send_buffer(self) -> None:
        data = memoryview(self._buf)[:self._fill]
        self._buf = bytearray(self.layout.chunk_size)
        self._fill = 0
        await self._send(data)

    async def _send(self, data: memoryview,
                    on_done: Callable[[asyncio.Task[None]], None] | None = None) -> None:
        """Start the PUTs of the next chunk, once fewer than ``max_in_flight`` are out;
        ``on_done`` is called when they have finished, however they finished."""
        index = self._index
        self._index += 1
        while len(self._tasks) >= self.max_in_flight:
            await self._wait_one()
        task = asyncio.ensure_future(self._put(index, data))
        if on_done is not None:
            task.add_done_callback(on_done)
        self._tasks.add(task)

    async def _wait_one(self) -> None:
        done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            self._tasks.discard(task)
            exc = task.exception()
            if exc is not None:
                await self.abort()
                raise exc

    async def _put(self, index: int, data: memoryview) -> None:
        crc = crc32c(data)
        name = chunk_id(self.file_id, index)
        puts = []
        for target in chunk_targets(self.layout, index):
            url = self.locations.get(target)
            if url is None:
                raise unknown_target(target)
            puts.append(self.plane.put_chunk(target, url, name, data, crc))
        await gather_or_cancel(puts)
        self._checksums[index] = crc
