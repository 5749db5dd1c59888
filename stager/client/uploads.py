"""S3 multipart uploads from the client's side: parts streamed by the write engine.

:class:`MultipartUploads` speaks the metadata server's multipart routes
(:mod:`stager.meta.multipart` says where parts go and why).  A part is streamed
through a :class:`~stager.dataplane.writer.StripedWriter` at the chunk index the server
gave (memory stays near the writer's window, a few chunks), its md5 (its S3 ETag) taken
on the way.  A part's writer has no reroute: a reroute would move the whole upload's
layout under the parts already written, so a part whose target fails fails, and the S3
client sends it again.  Completing commits the file where it lies when the server says
it can, after writing again in their slots the few parts it names (``move``); otherwise
the parts are composed here, read back in order and written as a new file (a streaming
copy: correct, and slower), which replaces the pending one.

Once the server has fixed the upload's part size, the slot of each later part of at
most that size is known (:class:`SlotCache`): the writer places it itself and skips the
part's begin request, half of a multipart PUT's metadata requests.  Parts that come
while this client's begin of their upload is on its way (boto3 sends its first ten at
once) wait for its answer and place themselves by it: one begin, not ten.  The part's record
(``multipart_part_done``) checks its place and the token's scope and refuses a part of
an upload aborted or completed meanwhile, as before.  A slot is used only while its
upload was seen alive in the last :data:`FRESH` seconds (a begin or a part recorded), at
most :data:`MAX_SLOT_AGE` after its begin (its capability's life), never after this
client completed or aborted the upload, and dropped on any error: the part sent again
then asks begin, which places it around a target gone down.  A part placed after
another client completed the upload (or begun just before that completion) cannot write
over the object's chunks: the completion sealed them at the data servers first
(:mod:`stager.data.seals`), which refuse its writes as UploadNotFound.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from ..bounded import Bounded
from ..dataplane.writer import StripedWriter
from ..errors import BadRequest, Unavailable
from ..protocol import paths
from ..protocol.models import FileInfo, LayoutSpec
from ..protocol.multipart import (
    CompleteRequest,
    CompleteResult,
    MultipartCreate,
    MultipartList,
    MultipartUpload,
    Part,
    PartBegin,
    PartDone,
    PartList,
    PartSlot,
)
from ..protocol.routes import route
from .async_client import AsyncClient

# md5 (S3's part ETag) runs at ~250 MB/s on the build machine: a piece this big is
# hashed on a thread (hashlib lets go of the GIL), not on the event loop
THREAD_HASH = 1 << 20
MAX_MOVES = 3
FRESH = 2.0             # seconds since the upload was last seen alive: a slot is used
MAX_SLOT_AGE = 60.0     # seconds since its begin (well within its capability's life)
MAX_SLOTS = 1024        # uploads (and closed ones) a client remembers
_CLOSED = None


class SlotCache:
    """The own-file slot of each upload in progress with a fixed part size, by upload id,
    with when it was begun and last seen alive (bounded, least recently used first out);
    ``None`` for an upload this client completed or aborted, never placed again."""

    def __init__(self, limit: int = MAX_SLOTS) -> None:
        self._slots: Bounded[str, tuple[PartSlot, float, float] | None] = Bounded(limit)

    def place(self, upload_id: str, number: int, size: int) -> PartSlot | None:
        """Part ``number``'s slot when it can be placed without asking, else None."""
        got = self._slots.get(upload_id)
        if got is None:
            return None
        slot, begun, seen = got
        now = time.monotonic()
        part = slot.part_size or 0
        if size > part or now - seen > FRESH or now - begun > MAX_SLOT_AGE:
            return None
        self._slots.move_to_end(upload_id)
        return replace(slot, first_chunk=(number - 1) * (part // slot.layout.chunk_size))

    def learn(self, upload_id: str, slot: PartSlot, asked: float) -> None:
        """Keep a begin's answer (asked at ``asked``) when it gives the part size; one
        without (a hidden part's: maybe placed around a target gone down) drops the
        upload's slot."""
        chunk = slot.layout.chunk_size
        if upload_id in self._slots and self._slots[upload_id] is _CLOSED:
            return
        if not slot.part_size or slot.part_size % chunk:
            self._slots.pop(upload_id, None)
            return
        self._slots.put(upload_id, (slot, asked, asked))

    def seen(self, upload_id: str, asked: float) -> None:
        """The upload was alive when a request sent at ``asked`` was answered."""
        got = self._slots.get(upload_id)
        if got is not None:
            self._slots[upload_id] = (got[0], got[1], max(got[2], asked))

    def drop(self, upload_id: str) -> None:
        self._slots.pop(upload_id, None)

    def close(self, upload_id: str) -> None:
        """Never place a part of ``upload_id`` again (completed or aborted here)."""
        self._slots.put(upload_id, _CLOSED)


# one per client (the gateway makes a MultipartUploads per request over its client)
_SLOTS: weakref.WeakKeyDictionary[AsyncClient, SlotCache] = weakref.WeakKeyDictionary()
# per client, the uploads with a begin on its way (set once answered, however)
_BEGINS: weakref.WeakKeyDictionary[AsyncClient, dict[str, asyncio.Event]] = \
    weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Completed:
    """A completed upload: the file, its S3 ETag (unquoted), the bytes copied to make it,
    and whether its parts were composed into a new file."""

    info: FileInfo
    etag: str
    copied: int                         # bytes copied: 0, a moved part's, or all (composed)
    composed: bool
    part_sizes: tuple[int, ...]


class MultipartUploads:
    """The multipart calls of one :class:`~stager.client.AsyncClient`."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        slots = _SLOTS.get(client)
        if slots is None:
            slots = _SLOTS[client] = SlotCache()
        self.slots = slots
        self.begins = _BEGINS.setdefault(client, {})

    async def create(self, path: str, *, layout: LayoutSpec | None = None,
                     extra: str = "") -> MultipartUpload:
        """Begin an upload of ``path``: nothing is visible there until it completes.
        ``extra``: text kept with the upload (read back with :meth:`parts`)."""
        body = MultipartCreate(paths.normalize(path), layout, extra).to_json()
        return MultipartUpload.from_json(await self.client.meta.request(
            route("multipart_create"), body=body))

    async def write_part(self, upload_id: str, number: int,
                         source: AsyncIterable[bytes | bytearray | memoryview] | bytes,
                         size: int, *, md5_of: Callable[[], str] | None = None,
                         give_back: Callable[[memoryview], None] | None = None) -> Part:
        """Write part ``number``: ``size`` bytes from ``source`` (a part sent before with
        that number is replaced).  Fewer or more bytes than ``size``: BadRequest, and
        nothing recorded.  ``md5_of``: the part's md5 (hex) once ``source`` is read,
        where its producer takes it anyway (the gateway's payload does), else taken here.
        ``give_back``: ``source``'s pieces are lent (a reader's ``stream(lend=True)``):
        each is handed to it once the writer no longer holds it."""
        placed = self.slots.place(upload_id, number, size)
        if placed is None and (begun := self.begins.get(upload_id)) is not None:
            # boto3 sends its first ten parts at once: they wait for one begin, which
            # fixes the part size, and place themselves by it, rather than each asking
            await begun.wait()
            placed = self.slots.place(upload_id, number, size)
        try:
            try:
                return await self._write_part(upload_id, number, source, size, md5_of,
                                              placed, give_back)
            except Unavailable:
                if placed is None or not isinstance(source, (bytes, bytearray, memoryview)):
                    raise       # a stream is spent: its sender sends the part again
                # placed without asking, on a target gone down since: ask, once (begin
                # places it around the target when the server knows it is down)
                self.slots.drop(upload_id)
                return await self._write_part(upload_id, number, source, size, md5_of, None,
                                              give_back)
        except BaseException:
            self.slots.drop(upload_id)      # the part sent again asks where it goes
            raise

    async def _write_part(self, upload_id: str, number: int,
                          source: AsyncIterable[bytes | bytearray | memoryview] | bytes,
                          size: int, md5_of: Callable[[], str] | None,
                          slot: PartSlot | None,
                          give_back: Callable[[memoryview], None] | None = None) -> Part:
        if slot is None:
            slot = await self._begin(upload_id, number, size)
        self.client.learn("write", slot.file_id, slot.capability)
        writer = StripedWriter(self.client.plane, slot.file_id, slot.layout, slot.locations,
                               max_in_flight=self.client.config.readahead_chunks,
                               first_chunk=slot.first_chunk)
        md5 = hashlib.md5(usedforsecurity=False)
        hashing = md5_of is None
        try:
            if isinstance(source, (bytes, bytearray, memoryview)):
                # the md5 on a thread (hashlib lets go of the GIL) while the chunks go out
                hashed = asyncio.ensure_future(asyncio.to_thread(md5.update, source))
                try:
                    await writer.write(source)
                finally:
                    await hashed
            else:
                async for data in source:
                    if hashing and len(data) >= THREAD_HASH:
                        await asyncio.to_thread(md5.update, data)
                    elif hashing:
                        md5.update(data)
                    # a lent piece: whole chunks go out from it (no copy), and it goes
                    # back to its lender once their PUTs are answered
                    await writer.write(data, None if give_back is None
                                       else partial(give_back, data))
                    if writer.size > size:
                        break
            if writer.size != size:     # fewer: S3's IncompleteBody; more: a bad request
                raise BadRequest(f"part {number}: {writer.size} bytes sent, {size} announced",
                                 sent=writer.size, size=size,
                                 **({"reason": "IncompleteBody"} if writer.size < size else {}))
            written, checksums = await writer.close()
        except BaseException:
            await asyncio.shield(writer.abort())
            raise
        digest = md5.hexdigest() if md5_of is None else md5_of()
        # a part in the upload's own chunks (a slot with the part size) lies in the
        # upload's layout, which the server knows: only a hidden part's is sent
        done = PartDone(slot.file_id, slot.first_chunk, written, digest, checksums,
                        None if slot.part_size else writer.layout)
        asked = time.monotonic()
        part = Part.from_json(await self.client.meta.request(
            route("multipart_part_done"), body=done.to_json(), upload_id=upload_id,
            number=number))
        self.slots.seen(upload_id, asked)
        return part

    async def _begin(self, upload_id: str, number: int, size: int) -> PartSlot:
        """Ask where part ``number`` goes; the upload's other parts that come meanwhile
        wait for the answer (:meth:`write_part`) when this is its only begin here."""
        begun = None if upload_id in self.begins else asyncio.Event()
        if begun is not None:
            self.begins[upload_id] = begun
        try:
            asked = time.monotonic()
            slot = PartSlot.from_json(await self.client.meta.request(
                route("multipart_part_begin"), body=PartBegin(size).to_json(),
                upload_id=upload_id, number=number))
            self.slots.learn(upload_id, slot, asked)
            return slot
        finally:
            if begun is not None:
                del self.begins[upload_id]
                begun.set()

    async def copy_part(self, upload_id: str, number: int, src: str, start: int = 0,
                        stop: int | None = None) -> Part:
        """Write part ``number`` from bytes ``[start, stop)`` of the file ``src``
        (S3's UploadPartCopy), streamed from its reader into the part's writer: in
        buffers the reader lends and takes back once written, not a zero-filled new
        one per chunk (and a range at a chunk boundary goes out from them uncopied)."""
        info = await self.client.stat(src)
        stop = info.size if stop is None else min(stop, info.size)
        if not 0 <= start <= stop:
            raise BadRequest(f"range {start}-{stop} is outside {src} ({info.size} bytes)",
                             reason="InvalidRange")
        reader = self.client.reader(info)
        return await self.write_part(upload_id, number, reader.stream(start, stop, lend=True),
                                     stop - start, give_back=reader.give_back)

    async def parts(self, upload_id: str) -> PartList:
        return PartList.from_json(await self.client.meta.request(
            route("multipart_parts"), upload_id=upload_id))

    async def uploads(self, prefix: str = "/", *, after: tuple[str, str] = ("", ""),
                      limit: int | None = None) -> MultipartList:
        """Uploads in progress whose path starts with ``prefix``, by (path, upload id)
        after ``after``."""
        query = {"prefix": prefix, "after_path": after[0] or None,
                 "after_id": after[1] or None, "limit": limit}
        return MultipartList.from_json(await self.client.meta.request(
            route("multipart_list"), query=query))

    async def complete(self, upload_id: str, parts: Sequence[tuple[int, str]],
                       attrs: dict[str, Any] | None = None) -> Completed:
        """Make the object of ``parts`` ((number, ETag), ascending) visible at once, its
        file committed with ``attrs``."""
        self.slots.close(upload_id)     # a late part must not write into the object
        moved = 0
        body = CompleteRequest(tuple(parts), dict(attrs or {})).to_json()
        for _ in range(MAX_MOVES):      # a part sent again meanwhile may need moving again
            result = CompleteResult.from_json(await self.client.meta.request(
                route("multipart_complete"), body=body, upload_id=upload_id))
            if result.file is not None:
                self.client.meta.forget(result.file.path)
                return Completed(result.file, result.etag, moved, False, result.part_sizes)
            if result.compose:
                return await self._compose(upload_id, result, dict(attrs or {}))
            for part in result.move:
                await self.write_part(upload_id, part.number, self._read(part), part.size,
                                      md5_of=lambda md5=part.md5: md5)      # the same bytes
                moved += part.size
        raise Unavailable(f"the parts of {upload_id} kept changing while it completed: "
                          "ask again")

    def _read(self, part: Part) -> AsyncIterable[memoryview]:
        """The bytes of ``part`` where it lies now."""
        assert part.slot is not None
        slot = part.slot
        self.client.learn("read", slot.file_id, slot.capability)
        before = slot.first_chunk * slot.layout.chunk_size
        info = FileInfo("/", "file", before + part.size, 0.0, slot.file_id, slot.layout,
                        checksums=(0,) * slot.first_chunk + part.checksums,
                        locations=slot.locations, capability=slot.capability)
        return self.client.reader(info).stream(before, before + part.size)

    async def _compose(self, upload_id: str, result: CompleteResult,
                       attrs: dict[str, Any]) -> Completed:
        """Copy the parts, in order, into a new file at the upload's path; then drop the
        upload (its pending file and parts are collected)."""
        upload = (await self.parts(upload_id)).upload

        async def pieces() -> AsyncIterator[memoryview]:
            for part in result.compose:
                async for piece in self._read(part):
                    yield piece

        info = await self.client.write_stream(upload.path, pieces(), attrs=lambda: attrs)
        await self.abort(upload_id)
        return Completed(info, result.etag, info.size, True, result.part_sizes)

    async def abort(self, upload_id: str) -> MultipartUpload:
        """Drop the upload: nothing becomes visible, its chunks are collected."""
        self.slots.close(upload_id)
        return MultipartUpload.from_json(await self.client.meta.request(
            route("multipart_abort"), upload_id=upload_id))
