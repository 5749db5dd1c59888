"""Fetch byte ranges of many files at once, in as few requests as the layout allows.

Pieces are grouped by the data server that holds them; pieces of one chunk
that lie close together are merged into one range; each group goes out as ONE
batched request (``POST /v1/read``) per target (split only past
``max_request_bytes`` so big batches still use several connections).  A failed
request sends its pieces to their next replica; when every replica failed the
round is retried after a pause, as the striped reader does.  Extents of at
least ``stream_above`` bytes that consist of whole chunks (a large file per
sample) go through :class:`~stager.dataplane.StripedReader` instead: each
chunk by ``sendfile``, all in parallel, CRC-checked end to end.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, NamedTuple

import numpy as np

from ..aio import gather_or_cancel
from ..checksum import crc32c
from ..client import AsyncClient
from ..dataplane.reader import FAILOVER_ERRORS, StripedReader
from ..errors import CorruptChunk, StagerError, TargetUnavailable
from ..layout import chunk_length, chunk_targets, pieces
from ..protocol.models import FileInfo, ReadItem, chunk_id
from . import spans
from .spans import Spans, cut

Buffer = bytes | bytearray | memoryview


class Extent(NamedTuple):
    """``length`` bytes of file number ``file`` (of the index's files) from ``offset``."""

    file: int
    offset: int
    length: int


@dataclass(frozen=True)
class FetchOptions:
    stream_above: int = 512 << 10       # extents this large made of whole chunks: GET each
    merge_gap: int = 16 << 10           # merge pieces of one chunk closer than this
    max_request_bytes: int = 8 << 20    # split a target's batch past this
    retries: int = 2
    bytes_in_flight: int = 32 << 20     # reads of the prefetch window out at once (two
                                        # fetch groups of small samples: this each)
    # pieces covering this much of a chunk of at least stream_above bytes (a merged
    # run, or for spans all of a fetch's pieces in it): GET the whole chunk
    whole_chunk_above: float = 0.75

    def reads_whole(self, full: Any, covered: Any) -> Any:
        """Whether a chunk of ``full`` bytes, ``covered`` of which are wanted, is read
        whole (element-wise on numpy arrays); its CRC32C must be known as well."""
        return (full >= self.stream_above) & (covered >= self.whole_chunk_above * full)


class _Piece:
    """One chunk piece of one extent (a plain slotted class: there are many per batch)."""

    __slots__ = ("extent", "dest", "chunk", "offset", "length", "replicas", "crc", "alone",
                 "tried", "full", "chunk_crc")

    def __init__(self, extent: int, dest: int, chunk: str, offset: int, length: int,
                 replicas: tuple[str, ...], full: int, chunk_crc: int | None) -> None:
        self.extent = extent          # index into the extents being fetched
        self.dest = dest              # offset inside the extent's buffer
        self.chunk = chunk
        self.offset = offset          # offset inside the chunk
        self.length = length
        self.replicas = replicas
        self.full = full              # the chunk's length
        self.chunk_crc = chunk_crc    # the chunk's committed CRC32C (None: not known)
        # expected CRC32C when the piece is a whole chunk
        self.crc = chunk_crc if offset == 0 and length == full else None
        self.alone = False            # the whole extent: handed out as bytes of its own
        self.tried: set[str] | None = None

    def untried(self) -> list[str]:
        return [t for t in self.replicas if t not in self.tried] if self.tried else \
            list(self.replicas)

    def mark(self, target: str) -> None:
        if self.tried is None:
            self.tried = set()
        self.tried.add(target)


@dataclass
class _Run:
    """Neighbouring pieces of one chunk, read as one range."""

    chunk: str
    start: int
    stop: int
    members: list[_Piece]


class Fetcher:
    """Reads extents of the given files; one instance per loader, shared by its fetches."""

    def __init__(self, client: AsyncClient, files: Sequence[FileInfo],
                 options: FetchOptions | None = None) -> None:
        self.client = client
        self.files = files
        self.options = options or FetchOptions()
        self._readers: dict[int, StripedReader] = {}
        # (file, chunk index) -> (chunk id, replicas, chunk length, CRC32C or None)
        self._where: dict[tuple[int, int], tuple[str, tuple[str, ...], int, int | None]] = {}
        self._urls: dict[str, str] = {}
        for f in files:
            self._urls.update(f.locations)
        # per file, for planning extents as arrays: chunk size (0: not a file), size
        self._chunk_size = np.array([f.layout.chunk_size if f.layout is not None
                                     and f.file_id is not None else 0 for f in files],
                                    dtype=np.int64)
        self._size = np.array([f.size for f in files], dtype=np.int64)
        self._spare: dict[int, list[bytearray]] = {}     # whole-chunk buffers, by size

    async def fetch(self, extents: Sequence[Extent] | Spans) -> list[bytes]:
        """The bytes of each extent, in order.

        Each extent becomes ``bytes`` as soon as its own read is done (copied
        out of the request or read buffer, which is freed at once), so a batch
        never sits in memory twice and decoding needs no further copy.
        Many small extents are best given as :class:`Spans` (planned as arrays).
        """
        if isinstance(extents, Spans):
            return await self._fetch_spans(extents)
        return await self._fetch_extents(extents)

    async def _fetch_extents(self, extents: Sequence[Extent]) -> list[bytes]:
        out: list[Buffer] = [b""] * len(extents)
        small: list[_Piece] = []
        large: list[int] = []
        split: set[int] = set()
        for i, e in enumerate(extents):
            if e.length == 0:
                continue
            parts = self._pieces(i, e)
            if e.length >= self.options.stream_above and all(p.crc is not None for p in parts):
                large.append(i)       # whole chunks: sendfile on the server, CRC end to end
                continue
            if len(parts) == 1:
                parts[0].alone = True
            else:
                out[i] = bytearray(e.length)
                split.add(i)
            small.extend(parts)
        jobs = [self._read_large(extents[i], out, i) for i in large]
        if small:
            jobs.append(self.read_pieces(small, out))
        await gather_or_cancel(jobs)
        for i in split:
            out[i] = bytes(out[i])
        return out  # type: ignore[return-value]

    async def _fetch_spans(self, sp: Spans) -> list[bytes]:
        out: list[Buffer] = [b""] * len(sp)
        file, offset, length = sp.file, sp.offset, sp.length
        cs = self._chunk_size[file]
        index = offset // np.maximum(cs, 1)
        start = offset - index * cs
        simple = (cs > 0) & (length > 0) & (length < self.options.stream_above) \
            & (offset >= 0) & (offset + length <= self._size[file]) & (start + length <= cs)
        ids = np.flatnonzero(simple)
        other = np.flatnonzero(~simple & (length > 0)).tolist()
        jobs = []
        if len(ids):
            p = spans.plan(self, ids, file[ids], index[ids], start[ids], length[ids])
            jobs.append(spans.read(self, p, out))
        if other:
            jobs.append(self._fetch_others(sp, other, out))
        await gather_or_cancel(jobs)
        return out  # type: ignore[return-value]

    async def _fetch_others(self, sp: Spans, which: list[int], out: list[Buffer]) -> None:
        got = await self._fetch_extents([
            Extent(int(sp.file[i]), int(sp.offset[i]), int(sp.length[i])) for i in which])
        for i, data in zip(which, got, strict=True):
            out[i] = data

    def url_of(self, target: str) -> str | None:
        return self._urls.get(target)

    def where(self, file: int, index: int) -> tuple[str, tuple[str, ...], int, int | None]:
        """Chunk ``index`` of file number ``file``: its id, replicas, length and
        committed CRC32C (None when the file has no checksums)."""
        where = self._where.get((file, index))
        if where is None:
            info = self.files[file]
            assert info.layout is not None and info.file_id is not None
            sums = info.checksums
            full = chunk_length(info.layout.chunk_size, info.size, index)
            where = self._where[(file, index)] = (
                chunk_id(info.file_id, index), tuple(chunk_targets(info.layout, index)),
                full, sums[index] if sums and index < len(sums) else None)
        return where

    @staticmethod
    def piece_at(i: int, name: str, replicas: tuple[str, ...], full: int, crc: int | None,
                 offset: int, length: int) -> _Piece:
        """Extent ``i``, the piece ``[offset, offset + length)`` of chunk ``name``."""
        piece = _Piece(i, 0, name, offset, length, replicas, full, crc)
        piece.alone = True
        return piece

    def _pieces(self, i: int, e: Extent) -> list[_Piece]:
        info = self.files[e.file]
        layout = info.layout
        if layout is None or info.file_id is None:
            raise ValueError(f"{info.path} is not a file")
        if e.offset < 0 or e.offset + e.length > info.size:
            raise ValueError(f"extent [{e.offset}, {e.offset + e.length}) is outside "
                             f"{info.path} ({info.size} bytes)")
        size, cs = layout.chunk_size, info.size
        index, offset = divmod(e.offset, size)
        if offset + e.length <= size:           # the usual case: inside one chunk
            return [self._piece(i, 0, e.file, index, offset, e.length)]
        return [self._piece(i, p.file_offset - e.offset, e.file, p.index, p.offset, p.length)
                for p in pieces(size, cs, e.offset, e.offset + e.length)]

    def _piece(self, i: int, dest: int, file: int, index: int, offset: int,
               length: int) -> _Piece:
        name, replicas, full, crc = self.where(file, index)
        return _Piece(i, dest, name, offset, length, replicas, full, crc)

    async def _read_large(self, e: Extent, out: list[Buffer], i: int) -> None:
        reader = self._readers.get(e.file)
        if reader is None:
            reader = self._readers[e.file] = self.client.reader(self.files[e.file])
        buf = bytearray(e.length)
        await reader.read_into(e.offset, memoryview(buf))
        out[i] = bytes(buf)

    # -- batched small reads ----------------------------------------------------------
    async def read_pieces(self, todo: list[_Piece], out: list[Buffer]) -> None:
        """Every piece, each from one of its replicas; rounds of failover, then retries."""
        errors: list[StagerError] = []
        for attempt in range(self.options.retries + 1):
            pending = todo
            stuck: list[_Piece] = []
            while pending:
                groups: dict[str, list[_Piece]] = defaultdict(list)
                for p in pending:
                    left = p.untried()
                    if left:
                        groups[self.client.plane.order_replicas(left)[0]].append(p)
                    else:
                        stuck.append(p)
                failed = await gather_or_cancel(
                    self._read_group(t, g, out) for t, g in groups.items())
                pending = []
                for target, err in zip(groups, failed, strict=True):
                    if err is not None:
                        errors.append(err)
                        for p in groups[target]:
                            p.mark(target)
                        pending.extend(groups[target])
            if not stuck:
                return
            if all(isinstance(e, CorruptChunk) for e in errors):
                break      # every replica answered, each one is bad: retrying will not help
            for p in stuck:
                p.tried = None
            todo = stuck
            if attempt < self.options.retries:
                await asyncio.sleep(0.1 * 2 ** attempt)
        raise _final_error(todo, errors)

    async def _read_group(self, target: str, group: list[_Piece],
                          out: list[Buffer]) -> StagerError | None:
        """Read ``group`` from ``target``; the error when the target failed it, else None."""
        url = self._urls.get(target)
        if url is None:
            return TargetUnavailable(f"target {target} is unknown", target=target)
        ranged, whole = [], []
        for run in _runs(group, self.options.merge_gap):
            first = run.members[0]
            if first.chunk_crc is not None and \
                    self.options.reads_whole(first.full, run.stop - run.start):
                whole.append(run)
            else:
                ranged.append(run)
        jobs = [self._request(target, url, req, out)
                for req in cut(ranged, [r.stop - r.start for r in ranged],
                               self.options.max_request_bytes)]
        jobs.extend(self._whole(target, url, run, out) for run in whole)
        try:
            await gather_or_cancel(jobs)
        except FAILOVER_ERRORS as exc:
            return exc
        return None

    async def _whole(self, target: str, url: str, run: _Run, out: list[Buffer]) -> None:
        first = run.members[0]
        assert first.chunk_crc is not None
        view = await self.read_chunk(target, url, run.chunk, first.full, first.chunk_crc,
                                     patient=len(first.replicas) == 1)
        try:
            self._hand_out(run.members, view, 0, out)
        finally:
            self.give_back(view)

    async def read_chunk(self, target: str, url: str, name: str, full: int, crc: int, *,
                         patient: bool) -> memoryview:
        """Chunk ``name`` whole, for pieces covering most of it: the server sends it
        with ``sendfile`` and it is checked here against its committed CRC32C,
        where a ranged read costs the server a read and a check per block.  The
        buffer is a reused one: :meth:`give_back` it once its bytes are copied out."""
        view = memoryview(self._take(full))
        async with self.client.limit:
            await self.client.plane.read_chunk_into(target, url, name, 0, view, whole=True,
                                                    patient=patient)
        if crc32c(view) != crc:
            self.client.plane.counter(target).errors += 1
            raise CorruptChunk(f"chunk {name} from target {target} failed its CRC32C",
                               chunk=name, target=target)
        return view

    def _take(self, size: int) -> bytearray:
        """A buffer of ``size`` bytes: a spare one, else a new one (a new 4 MiB
        buffer costs as much to zero and fault in as a chunk costs to receive)."""
        spare = self._spare.get(size)
        return spare.pop() if spare else bytearray(size)

    def give_back(self, view: memoryview) -> None:
        """Keep the buffer under ``view`` for the next whole-chunk read (at most
        ``bytes_in_flight`` of them are kept).  Only a read that finished gives
        its buffer back: a cancelled one may still be writing to it."""
        buf = view.obj
        view.release()
        assert isinstance(buf, bytearray)
        if self._spare_bytes() + len(buf) <= self.options.bytes_in_flight:
            self._spare.setdefault(len(buf), []).append(buf)

    def _spare_bytes(self) -> int:
        return sum(size * len(bufs) for size, bufs in self._spare.items())

    async def _request(self, target: str, url: str, runs: list[_Run],
                       out: list[Buffer]) -> None:
        items = [ReadItem(r.chunk, r.start, r.stop - r.start) for r in runs]
        buf = bytearray(sum(i.length for i in items))
        view = memoryview(buf)
        # A piece with no other replica waits request_timeout; else a silent
        # target is given up after failover_timeout for the next replica.
        patient = any(len(p.replicas) == 1 for run in runs for p in run.members)
        async with self.client.limit:
            await self.client.plane.batch_read_into(target, url, items, view, patient=patient)
        base = 0
        for run in runs:
            for p in run.members:
                if p.crc is not None:
                    at = base + p.offset - run.start
                    if crc32c(view[at:at + p.length]) != p.crc:
                        self.client.plane.counter(target).errors += 1
                        raise CorruptChunk(f"chunk {p.chunk} from target {target} failed its "
                                           "CRC32C", chunk=p.chunk, target=target)
            self._hand_out(run.members, view, base - run.start, out)
            base += run.stop - run.start

    @staticmethod
    def _hand_out(pieces: list[_Piece], view: memoryview, shift: int,
                  out: list[Buffer]) -> None:
        """Copy each piece out of ``view``, where chunk offset ``o`` is at ``o + shift``."""
        for p in pieces:
            at = p.offset + shift
            if p.alone:
                out[p.extent] = bytes(view[at:at + p.length])
            else:
                out[p.extent][p.dest:p.dest + p.length] = view[at:at + p.length]


def _runs(group: list[_Piece], gap: int) -> list[_Run]:
    """Pieces sorted by place; those of one chunk within ``gap`` bytes merged."""
    runs: list[_Run] = []
    group = sorted(group, key=_offset)      # by chunk, then offset: two stable sorts,
    group.sort(key=_chunk)                  # no key tuple per piece
    for p in group:
        last = runs[-1] if runs else None
        if last is not None and last.chunk == p.chunk and p.offset <= last.stop + gap:
            last.stop = max(last.stop, p.offset + p.length)
            last.members.append(p)
        else:
            runs.append(_Run(p.chunk, p.offset, p.offset + p.length, [p]))
    return runs


_offset = attrgetter("offset")
_chunk = attrgetter("chunk")


def _final_error(todo: list[_Piece], errors: list[StagerError]) -> StagerError:
    name = todo[0].chunk if todo else "?"
    if errors and all(isinstance(e, CorruptChunk) for e in errors):
        return CorruptChunk(f"every replica of chunk {name} is corrupt", chunk=name)
    last = errors[-1] if errors else None
    return TargetUnavailable(f"chunk {name} unavailable: {last}", chunk=name,
                             targets=sorted({p for t in todo for p in t.replicas}))
