"""Striped writes: cut a stream into chunks and store each on all its replicas in parallel.

A chunk write that fails on a target (refused, reset, timed out, 5xx, 507, or
answered without proving the chunk stored: :mod:`stager.dataplane.ack`) does
not fail the file when the writer has a ``reroute`` (the client's and the
gateway's have): the writer reports the target, the metadata server answers
with a layout that has another target in its slot (marking the target suspect
for every writer only when its own health probe of it fails too:
:mod:`stager.meta.reroute`), and the writer

* stores the chunks still being written where the new layout wants them, and
* copies every chunk it already stored on fewer targets than the new layout
  names, from a surviving replica (checked against the chunk's CRC32C), so that
  no chunk is acknowledged on fewer than ``replicas`` copies.

The commit then records the layout that was actually written.  When no surviving
copy of a stored chunk is left (one replica, on the target that failed), the
error stands: the caller may send the whole file again (``pipe`` does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from ..aio import cancel_and_wait
from ..checksum import crc32c
from ..errors import (
    CorruptChunk,
    InsufficientStorage,
    InternalError,
    NoTargets,
    StagerError,
    StorageError,
    Unavailable,
)
from ..layout import chunk_targets
from ..protocol.models import Layout, chunk_id
from .goodcopy import read_good_copy
from .transport import DataPlane, unknown_target

# (target, the failure, chunks begun) -> the upload's new layout and the targets' URLs
Reroute = Callable[[str, StagerError, int], Awaitable[tuple[Layout, Mapping[str, str]]]]
# What a write routes around: the target, not the request, is at fault.
WRITE_FAILOVER = (Unavailable, InsufficientStorage, StorageError, InternalError, CorruptChunk)


def routes_around(exc: BaseException) -> bool:
    """Whether a failed chunk write ``exc`` is one to route around."""
    return isinstance(exc, WRITE_FAILOVER) and not isinstance(exc, NoTargets)


def only_full(failure: BaseException | str) -> bool:
    """Whether a failed chunk write (its error, or the error's wire code) says only
    that the target is full: a full target is not a dead one.  It still serves the
    chunks it holds, so it is routed around but neither made suspect nor probed."""
    code = failure if isinstance(failure, str) else getattr(failure, "code", None)
    return code == InsufficientStorage.code


def reroute_failed(why: StagerError, cause: StagerError) -> StagerError:
    """The error of a write whose reroute failed (``why``, e.g. too few healthy
    nodes), naming the chunk write failure that asked for it.  Where the target
    answered from its disk (full, EIO), that stays the error's kind: its errno
    (ENOSPC, EIO) is what a caller, the mount's included, must see."""
    if isinstance(why, NoTargets) and isinstance(cause, (InsufficientStorage, StorageError)):
        return type(cause)(f"{cause.message}; no other target: {why.message}", **cause.details)
    return type(why)(f"{why.message} (after: {cause.message})", **why.details)


class StripedWriter:
    """Accepts bytes in any sizes; PUTs each full chunk to every replica.

    At most ``max_in_flight`` chunks are being sent at once; ``write`` waits
    when the window is full, so memory stays near ``max_in_flight × chunk_size``.
    A chunk counts as written only when every replica the layout names for it
    answered that it stored it durably, with the size and CRC32C this writer sent
    (checked by :meth:`DataPlane.put_chunk`, see :mod:`stager.dataplane.ack`).
    ``reroute``: see the module doc; without it, a failed chunk write fails the
    writer.
    """

    MAX_REROUTES = 16        # reports per file before a failure is let stand

    def __init__(self, plane: DataPlane, file_id: str, layout: Layout,
                 locations: Mapping[str, str], *, max_in_flight: int = 8,
                 reroute: Reroute | None = None) -> None:
        self.plane = plane
        self.file_id = file_id
        self.layout = layout
        self.locations = dict(locations)
        self.max_in_flight = max(1, max_in_flight)
        self.size = 0
        self.rerouted: list[str] = []       # the targets routed around, in order
        self._index = 0
        self._buf = bytearray(layout.chunk_size)
        self._fill = 0
        self._checksums: dict[int, int] = {}
        self._short: dict[int, int] = {}     # the length of a chunk shorter than chunk_size
        # The layouts written to, oldest first, and per stored chunk the one whose
        # targets hold it: what a copy after a reroute reads from.
        self._layouts = [layout]
        self._stored_under: dict[int, int] = {}
        self._failed: set[str] = set()
        self._reroute = reroute
        self._rerouting = asyncio.Lock()
        self._copying = asyncio.Semaphore(self.max_in_flight)
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
            await self.flush()
        return self.size, tuple(self._checksums[i] for i in range(self._index))

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
        self._checksums[index] = crc32c(data)
        if len(data) < self.layout.chunk_size:
            self._short[index] = len(data)
        await self._place(index, data, set())

    async def _place(self, index: int, data: memoryview, placed: set[str]) -> None:
        """Store chunk ``index`` on every target the current layout names for it that
        ``placed`` lacks, routing around the targets that fail, until none is left."""
        name = chunk_id(self.file_id, index)
        crc = self._checksums[index]
        while True:
            want = [t for t in chunk_targets(self.layout, index) if t not in placed]
            for target in want:
                if target not in self.locations:    # no address: nothing to route around
                    raise unknown_target(target)
            if not want:
                # No await since the check: a reroute sees this chunk as stored under
                # the layout it was checked against.
                self._stored_under[index] = len(self._layouts) - 1
                return
            results = await asyncio.gather(
                *(self.plane.put_chunk(t, self.locations[t], name, data, crc) for t in want),
                return_exceptions=True)
            for target, result in zip(want, results, strict=True):
                if result is None:
                    placed.add(target)
                elif isinstance(result, Exception) and routes_around(result) and self._reroute:
                    await self._route_around(target, result)
                else:
                    raise result

    async def _route_around(self, target: str, exc: StagerError) -> None:
        """Report ``target`` and take the layout that replaces it (one report at a
        time; a target already replaced is not reported again); then copy the stored
        chunks the new layout places where they are not."""
        assert self._reroute is not None
        async with self._rerouting:
            if target not in self.layout.targets:
                return
            if len(self.rerouted) >= self.MAX_REROUTES:
                raise exc
            if not only_full(exc):
                self._failed.add(target)    # a full target still serves what it holds
            try:
                layout, locations = await self._reroute(target, exc, self._index)
            except StagerError as why:
                raise reroute_failed(why, exc) from exc
            if layout == self.layout:
                raise exc           # nothing to replace it with: the failure stands
            self.rerouted.append(target)
            self.layout = layout
            self.locations.update(locations)
            self._layouts.append(layout)
            for index, under in list(self._stored_under.items()):
                held = set(chunk_targets(self._layouts[under], index)) - self._failed
                if set(chunk_targets(layout, index)) - held:
                    del self._stored_under[index]       # stored again once copied
                    self._spawn(self._copy_stored(index, held))

    def _spawn(self, job: Awaitable[None]) -> None:
        self._tasks.add(asyncio.ensure_future(job))

    async def _copy_stored(self, index: int, held: set[str]) -> None:
        """Chunk ``index`` is stored on ``held``: read it from one of them (checked
        against its CRC32C) and place it where the current layout wants it."""
        sources = [(t, self.locations[t]) for t in sorted(held) if t in self.locations]
        async with self._copying:
            buf = bytearray(self._short.get(index, self.layout.chunk_size))
            await read_good_copy(self.plane, chunk_id(self.file_id, index), sources,
                                 memoryview(buf), self._checksums[index])
            await self._place(index, memoryview(buf), set(held))
