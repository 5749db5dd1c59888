"""S3 multipart uploads on the metadata server: where each part goes, and completion.

Creating an upload begins a pending upload of the final file, as any write does
(:func:`stager.meta.writes.create`), and keeps a record beside it
(:mod:`stager.meta.store.multipart`): the file stays invisible until completed, and
the record, not ``upload_grace``, decides when it is abandoned (``multipart_idle``
after its last part).

Where a part goes is decided by its size before it is written.  The first part of a
whole number of chunks fixes the upload's part size P (boto3 and the AWS CLI send equal
parts of 8 MiB, the last one shorter).  Part N of at most P bytes is written straight
into the final file's chunk slots from ``(N-1)·P/chunk_size``; any other part into a
hidden file of its own (its id derived from the upload and N, so a part sent again
writes over the same chunks).  When the parts completed are 1..k, all in place and all
but the last exactly P bytes, completing is a commit of the final file with the parts'
checksums: nothing is copied.  A part that went to a hidden file only because it began
before P was fixed (boto3's short last part, sent alongside the first) is written
again into its slot first (``move``: that part's bytes are copied, no others).
Otherwise completion answers the parts in order and the writer composes them into a
new file by a streaming copy (correct, and slower), then drops the upload.  Part
numbers, order, ETags and the minimum part size are checked here,
in one place, for every gateway.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..bounded import Bounded
from ..errors import BadRequest, NotFound, StagerError, Unavailable, UploadNotFound
from ..layout import choose_layout, chunk_targets
from ..protocol.batch import CommitItem, CreateItem
from ..protocol.models import FileInfo, Layout, LayoutSpec, TargetInfo
from ..protocol.multipart import (
    CompleteResult,
    Part,
    PartDone,
    PartSlot,
    SealRequest,
    SealResult,
    part_number,
)
from . import writes
from .store.base import NodeEntry
from .store.multipart import MultipartRecord, PartRecord

if TYPE_CHECKING:
    from .service import MetaService

log = logging.getLogger("stager.meta")
# asks a data server to seal chunks (or lift a seal): the HTTP layer's, over its data plane
Sealer = Callable[[TargetInfo, SealRequest], Awaitable[SealResult]]
_HIDDEN = uuid.UUID("5b0c6f3e-54a3-4c8e-9c1e-6d2b1f0e7a11")   # hidden parts' id namespace
SETTLED = 1024          # records of uploads with a fixed part size kept in memory


def hidden_part_id(upload_id: str, number: int) -> str:
    """The file id of part ``number`` of ``upload_id`` when it is not in place."""
    return uuid.uuid5(_HIDDEN, f"{upload_id}/{number}").hex


def multipart_etag(md5s: Sequence[str]) -> str:
    """S3's ETag of an object made of parts with these md5s (hex): the md5 of their
    md5s, a dash, their count."""
    digest = hashlib.md5(b"".join(bytes.fromhex(m) for m in md5s), usedforsecurity=False)
    return f"{digest.hexdigest()}-{len(md5s)}"


def invalid(reason: str, message: str, **details: object) -> BadRequest:
    """A refused completion; ``reason`` is the S3 error it is (the gateway maps it)."""
    return BadRequest(message, reason=reason, **details)


def check_completion(requested: Sequence[tuple[int, str]], parts: dict[int, PartRecord],
                     min_part: int) -> list[PartRecord]:
    """The parts a completion names, in order, after S3's checks: numbers ascending
    (``InvalidPartOrder``), each written with that ETag (``InvalidPart``), each but the
    last at least ``min_part`` bytes (``EntityTooSmall``)."""
    chosen = []
    for i, (number, etag) in enumerate(requested):
        if i and number <= requested[i - 1][0]:
            raise invalid("InvalidPartOrder", "the list of parts was not in ascending order",
                          part=number)
        part = parts.get(number)
        if part is None or etag.strip().strip('"').lower() != part.md5:
            raise invalid("InvalidPart", f"part {number} was not uploaded, or its ETag "
                          "does not match", part=number)
        chosen.append(part)
    for part in chosen[:-1]:
        if part.size < min_part:
            raise invalid("EntityTooSmall", f"part {part.number} is {part.size} bytes, "
                          f"less than the least allowed, {min_part}", part=part.number,
                          size=part.size, min_size=min_part)
    return chosen


def misplaced(record: MultipartRecord, chosen: Sequence[PartRecord]
              ) -> list[PartRecord] | None:
    """The parts of ``chosen`` not yet in their slots of the final file, when the rest
    are and each of these fits its slot (parts 1..k, all but the last exactly the part
    size, the last at most); ``None`` when they cannot lie in place: composed."""
    size = record.part_size
    if size is None or any(p.layout is not None for p in chosen):
        return None     # a part placed around a down target: the upload's layout names it
    per = size // record.layout.chunk_size
    if not all(p.number == i and (p.size == size or i == len(chosen) and p.size <= size)
               for i, p in enumerate(chosen, 1)):
        return None
    return [p for p in chosen if (p.file_id, p.first_chunk)
            != (record.file_id, (p.number - 1) * per)]


class MultipartService:
    """The multipart operations over the store and the service's writes."""

    def __init__(self, service: MetaService) -> None:
        self.service = service
        self.store = service.store
        self.config = service.config
        # upload id -> its record once the part size is fixed: what a part's record
        # reads of it (path, file id, layout, part size) never changes from then on
        self._settled: Bounded[str, MultipartRecord] = Bounded(SETTLED)

    async def create(self, path: str, layout: LayoutSpec | None, extra: str = ""
                     ) -> MultipartRecord:
        [begun] = await writes.create(self.service, [CreateItem(path, layout)])
        if isinstance(begun, StagerError):
            raise begun
        upload, _ = begun
        now = self.service.clock()
        record = MultipartRecord(uuid.uuid4().hex, upload.path, upload.file_id, upload.layout,
                                 None, now, now, extra)
        await self.store.begin_multipart(record)
        return record

    async def get(self, upload_id: str) -> MultipartRecord:
        try:
            return await self.store.get_multipart(upload_id)
        except NotFound:
            raise UploadNotFound(f"no multipart upload {upload_id}",
                                 upload_id=upload_id) from None

    async def settled(self, upload_id: str) -> MultipartRecord:
        """The record, as a part's record reads it: from memory once its part size is
        fixed (boto3's parts of 8 MiB: ~128 records a GiB, each a store read saved).
        Not fresh (``touched`` may be older); the store's write of the part checks
        the upload is still there (:meth:`record_part`)."""
        record = self._settled.get(upload_id)
        if record is None:
            record = await self.get(upload_id)
            if record.part_size is not None:
                self._settled.put(upload_id, record)
        return record

    def slot(self, record: MultipartRecord, file_id: str, first_chunk: int,
             layout: Layout | None = None, part_size: int | None = None) -> PartSlot:
        layout = layout or record.layout
        info = self.service.info(NodeEntry(record.path, "file", 0, record.created, file_id,
                                           layout))
        return PartSlot(file_id, first_chunk, layout, info.locations, part_size=part_size)

    def around_down(self, record: MultipartRecord, file_id: str) -> Layout | None:
        """A layout of its own for a hidden part when the upload's names a target not
        up now (its parts would fail there: a part is not rerouted); else None."""
        placeable = {t.id for t in self.service.placeable_targets()}
        if set(record.layout.targets) <= placeable:
            return None
        old = record.layout
        return choose_layout(self.service.placeable_targets(), chunk_size=old.chunk_size,
                             stripe_count=0, replicas=old.replicas,     # every one up
                             max_stripe_count=self.config.max_stripe_count,
                             start=int(file_id[:8], 16))

    async def begin_part(self, record: MultipartRecord, number: int, size: int) -> PartSlot:
        """Where part ``number`` of ``size`` bytes of the upload ``record`` (as the caller
        read it, to authorize the request: not read again) goes (see the module's
        docstring)."""
        number = part_number(number)
        upload_id = record.upload_id
        hidden = hidden_part_id(upload_id, number)
        own = self.around_down(record, hidden)
        if own is not None:
            return self.slot(record, hidden, 0, own)
        chunk, fixed = record.layout.chunk_size, record.part_size
        if fixed is None and size > 0 and size % chunk == 0:
            fixed = await self.store.fix_part_size(upload_id, size)
        if fixed is not None and size <= fixed:
            # with the part size: the writer places its next such parts itself
            return self.slot(record, record.file_id, (number - 1) * (fixed // chunk),
                             part_size=fixed)
        return self.slot(record, hidden, 0)

    async def record_part(self, record: MultipartRecord, number: int, done: PartDone
                          ) -> Part:
        """Keep part ``number`` of the upload ``record`` (as the caller read it, maybe
        :meth:`settled`) as written where :meth:`begin_part` said; the store's write
        checks the upload is still there (refused when aborted or completed)."""
        number = part_number(number)
        upload_id = record.upload_id
        chunk = record.layout.chunk_size
        if len(done.checksums) != -(-done.size // chunk):
            raise BadRequest(f"a {done.size}-byte part has {-(-done.size // chunk)} chunks, "
                             f"got {len(done.checksums)} checksums")
        fixed = record.part_size or 0
        own = fixed and done.size <= fixed and \
            (done.file_id, done.first_chunk) == (record.file_id, (number - 1) * (fixed // chunk))
        if not own and (done.file_id, done.first_chunk) != (hidden_part_id(upload_id, number),
                                                            0):
            raise BadRequest(f"part {number} of {upload_id} does not go to "
                             f"{done.file_id} from chunk {done.first_chunk}")
        part = PartRecord(number, done.file_id, done.first_chunk, done.size, done.md5,
                          done.checksums, self.service.clock(),
                          self._own_layout(record, done))
        if not await self.store.put_part(upload_id, part):
            self._settled.pop(upload_id, None)
            raise UploadNotFound(f"no multipart upload {upload_id}", upload_id=upload_id)
        return Part(number, part.size, part.md5, part.written)

    def _own_layout(self, record: MultipartRecord, done: PartDone) -> Layout | None:
        """The layout a hidden part was written in, when not the upload's: the one
        :meth:`around_down` chose (or a writer's reroute of it), of known targets."""
        if done.layout is None or done.layout == record.layout:
            return None
        if done.file_id == record.file_id:
            raise BadRequest("a part in the upload's own chunks is in the upload's layout")
        if done.layout.chunk_size != record.layout.chunk_size or \
                not set(done.layout.targets) <= set(self.service.targets):
            raise BadRequest("a part's layout names unknown targets or another chunk size")
        return done.layout

    async def parts(self, upload_id: str) -> tuple[MultipartRecord, list[PartRecord]]:
        return await self.get(upload_id), await self.store.list_parts(upload_id)

    async def uploads(self, prefix: str, after: tuple[str, str], limit: int
                      ) -> list[MultipartRecord]:
        return await self.store.list_multipart(prefix, after=after, limit=limit)

    async def complete(self, upload_id: str, requested: Sequence[tuple[int, str]],
                       attrs: dict[str, Any] | None = None, seal: Sealer | None = None
                       ) -> CompleteResult:
        """Commit the final file as its parts lie (no copy), with ``attrs``, or answer
        the parts to compose (the client commits the composed file with them); the
        checks are S3's (:func:`check_completion`).  ``seal``: how a data server is
        asked to seal the file's chunks there before it commits (:meth:`_seal`)."""
        record, parts = await self.parts(upload_id)
        chosen = check_completion(requested, {p.number: p for p in parts},
                                  self.config.multipart_min_part)
        etag = multipart_etag([p.md5 for p in chosen])
        sizes = tuple(p.size for p in chosen)
        moves = misplaced(record, chosen)
        if moves != []:
            listed = tuple(Part(p.number, p.size, p.md5, p.written,
                                self.slot(record, p.file_id, p.first_chunk, p.layout),
                                p.checksums)
                           for p in (chosen if moves is None else moves))
            if moves is None:
                return CompleteResult(etag, sizes, compose=listed)
            return CompleteResult(etag, sizes, move=listed)
        checksums = tuple(c for p in chosen for c in p.checksums)
        size = sum(p.size for p in chosen)
        sealed = await self._seal(record, checksums, seal) if seal is not None else []
        try:
            [done] = await writes.commit(self.service, [CommitItem(
                record.file_id, size, checksums, attrs=dict(attrs or {}))])
            if isinstance(done, UploadNotFound):
                done = await self._committed_before(record, done)
        except StagerError as exc:      # (the store out of reach, say): nothing committed
            done = exc
        if isinstance(done, StagerError):
            await self._unseal(record, sealed, seal)
            raise done
        await self.store.drop_multipart(upload_id, keep={record.file_id},
                                        now=self.service.clock())
        self._settled.pop(upload_id, None)
        return CompleteResult(etag, sizes, file=done)

    async def _seal(self, record: MultipartRecord, checksums: Sequence[int],
                    seal: Sealer) -> list[TargetInfo]:
        """Seal the final file's chunks at every data server holding one, with the CRCs
        it commits (stager/data/seals.py): a part still on its way from another client
        is refused there from now on, and one stored before is named back.  Each chunk
        needs a copy confirmed with its bytes, else nothing commits (Unavailable: a part
        was written again meanwhile, or every copy's target is out of reach).  Returns
        the targets sealed."""
        layout, count = record.layout, len(checksums)
        held: dict[str, list[tuple[int, int]]] = {}
        for index, crc in enumerate(checksums):
            for target in chunk_targets(layout, index):
                held.setdefault(target, []).append((index, crc))
        known = [(self.service.targets.get(t), crcs) for t, crcs in held.items()]
        asked = [(t, crcs) for t, crcs in known if t is not None]
        answers = await asyncio.gather(*(seal(t, SealRequest(record.file_id, count,
                                                             tuple(crcs)))
                                         for t, crcs in asked), return_exceptions=True)
        good: set[int] = set()
        sealed = []
        for (target, crcs), answer in zip(asked, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, (StagerError, OSError)):
                    raise answer
                log.warning("sealing %s on %s: %s", record.file_id, target.id, answer)
                continue
            sealed.append(target)
            good.update(i for i, _ in crcs if i not in set(answer.differ))
        missing = sorted(set(range(count)) - good)
        if missing:
            await self._unseal(record, sealed, seal)
            raise Unavailable(f"chunk {missing[0]} of {record.path} is not as its part was "
                              "recorded (a part written again while the upload completed, "
                              "or no copy within reach): complete again",
                              upload_id=record.upload_id, chunk=missing[0])
        return sealed

    async def _unseal(self, record: MultipartRecord, sealed: Sequence[TargetInfo],
                      seal: Sealer | None) -> None:
        """Lift the seals of a completion that does not commit (best effort: a seal
        left behind refuses the upload's later parts in that file, as NoSuchUpload)."""
        if seal is None:
            return
        release = SealRequest(record.file_id, 0, (), release=True)
        for answer in await asyncio.gather(*(seal(t, release) for t in sealed),
                                           return_exceptions=True):
            if isinstance(answer, BaseException):
                log.warning("releasing the seal of %s: %s", record.file_id, answer)

    async def _committed_before(self, record: MultipartRecord, gone: UploadNotFound
                                ) -> FileInfo | StagerError:
        """A completion asked again after its commit went through (the record's drop
        did not): the file at the path is the upload's own."""
        try:
            info = await self.service.stat(record.path)
        except NotFound:
            return gone
        return info if info.file_id == record.file_id else gone

    async def abort(self, upload_id: str) -> MultipartRecord:
        """Drop the upload: its pending file and hidden parts go to garbage."""
        self._settled.pop(upload_id, None)
        try:
            return await self.store.drop_multipart(upload_id, keep=(),
                                                   now=self.service.clock())
        except NotFound:
            raise UploadNotFound(f"no multipart upload {upload_id}",
                                 upload_id=upload_id) from None

    async def collect_idle(self) -> int:
        """Abort every upload with no part written for ``multipart_idle``; how many."""
        idle = await self.store.idle_multipart(self.service.clock()
                                               - self.config.multipart_idle)
        for record in idle:
            log.info("multipart upload %s of %s idle: collecting", record.upload_id,
                     record.path)
            self._settled.pop(record.upload_id, None)
            try:
                await self.store.drop_multipart(record.upload_id, keep=(),
                                                now=self.service.clock())
            except NotFound:
                pass        # completed or aborted meanwhile
        return len(idle)
