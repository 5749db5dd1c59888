"""Many small extents planned as arrays: the loader's hot path for small samples.

A batch of small samples is thousands of extents.  Planning them one Python
object at a time (a piece, a tuple, a list each) made the I/O thread the
bottleneck, and the objects, living through the prefetch window, kept Python's
garbage collector busy.  Here the usual case, an extent inside one chunk, is
planned with numpy: chunk of each extent, runs of neighbouring extents of one
chunk merged into one range, runs grouped into one request per target.  The
only per-extent Python work left is copying each sample's bytes out of the
request buffer.

Only the first round is planned so: extents a failed target held go to
:meth:`Fetcher.read_pieces`, which fails over replica by replica and retries,
as for any other extent.  Extents that are large, cross a chunk boundary or are
out of range take :meth:`Fetcher.fetch`'s general path (which says what is
wrong with a bad one).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from ..aio import gather_or_cancel
from ..checksum import crc32c
from ..dataplane.reader import FAILOVER_ERRORS
from ..errors import CorruptChunk, TargetUnavailable
from ..protocol.models import ReadItem

if TYPE_CHECKING:
    from .fetch import Buffer, Fetcher

_SHIFT = 40            # chunk number << _SHIFT + offset: one sortable position
T = TypeVar("T")


@dataclass(frozen=True)
class Spans:
    """Extents as arrays: ``length[i]`` bytes of file ``file[i]`` from ``offset[i]``.

    A loader's formats also say which unit (what is fetched and decoded as a
    whole: a sample, a row group, a row of zarr chunks) extent ``i`` belongs to:
    ``unit[i]``, the extents of one unit next to each other.  A unit may have
    several extents (a zarr row's chunks) or none (a row never written)."""

    file: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    unit: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.file)

    @property
    def nbytes(self) -> int:
        return int(self.length.sum())

    def take(self, which: np.ndarray) -> Spans:
        return Spans(self.file[which], self.offset[which], self.length[which],
                     None if self.unit is None else self.unit[which])

    def of_units(self, units: np.ndarray) -> Spans:
        """The extents of the given units (which must be some of this one's)."""
        assert self.unit is not None, "these extents belong to no units"
        return self.take(np.isin(self.unit, units))

    def unit_sizes(self, units: np.ndarray) -> np.ndarray:
        """Bytes of each of ``units`` (distinct, each one's extents here; 0 for none)."""
        return np.bincount(self._positions(units), weights=self.length,
                           minlength=len(units)).astype(np.int64)

    def split(self, units: np.ndarray, buffers: list[bytes]) -> list[list[bytes]]:
        """``buffers`` (one per extent, as fetched) cut into each unit's list, for
        ``units`` in the order their extents lie here (distinct, as a fetch's are)."""
        counts = np.bincount(self._positions(units), minlength=len(units))
        bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
        return [buffers[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def _positions(self, units: np.ndarray) -> np.ndarray:
        """For each extent, the position of its unit in ``units``."""
        assert self.unit is not None, "these extents belong to no units"
        units = np.asarray(units, dtype=np.int64)
        order = np.argsort(units, kind="stable")
        return order[np.searchsorted(units[order], self.unit)]

    @classmethod
    def concat(cls, parts: list[Spans]) -> Spans:
        units = [p.unit for p in parts]
        return cls(np.concatenate([p.file for p in parts]),
                   np.concatenate([p.offset for p in parts]),
                   np.concatenate([p.length for p in parts]),
                   None if any(u is None for u in units)
                   else np.concatenate(units))  # type: ignore[arg-type]


@dataclass
class _Plan:
    """Extents inside one chunk each, sorted by (chunk, offset) and merged into runs."""

    ids: np.ndarray          # the extents' numbers in the fetch, sorted
    chunk: np.ndarray        # per sorted extent: its chunk (index into ``chunks``)
    start: np.ndarray        # per sorted extent: offset inside the chunk
    length: np.ndarray
    checked: np.ndarray      # per sorted extent: a whole chunk with a known CRC32C
    runs: np.ndarray         # first sorted extent of each run (and len(ids) at the end)
    lo: list[int]            # per run: range inside its chunk
    hi: list[int]
    run_chunk: list[int]
    whole: list[bool]        # per run: the whole chunk, read with GET (see read)
    chunks: list[tuple[str, tuple[str, ...], int, int | None]]   # see Fetcher.where


def plan(fetcher: Fetcher, ids: np.ndarray, file: np.ndarray, index: np.ndarray,
         start: np.ndarray, length: np.ndarray) -> _Plan:
    key = (file.astype(np.int64) << 32) | index
    keys, chunk = np.unique(key, return_inverse=True)
    chunks = [fetcher.where(k >> 32, k & 0xFFFFFFFF) for k in keys.tolist()]
    order = np.lexsort((start, chunk))
    ids, chunk, start, length = ids[order], chunk[order], start[order], length[order]
    full = np.array([c[2] for c in chunks], dtype=np.int64)
    known = np.array([c[3] is not None for c in chunks], dtype=bool)
    checked = (start == 0) & (length == full[chunk]) & known[chunk]
    # A chunk the extents cover mostly (in bytes, however fragmented) is read
    # whole: one run per chunk from 0 to its end.
    opts = fetcher.options
    covered = np.bincount(chunk, weights=length, minlength=len(chunks))
    whole = known & opts.reads_whole(full, covered)
    base = chunk.astype(np.int64) << _SHIFT
    begin, end = base + start, base + start + length
    reach = np.maximum.accumulate(end)
    new = np.ones(len(ids), dtype=bool)
    new[1:] = (begin[1:] > reach[:-1] + opts.merge_gap) & ~whole[chunk[1:]]
    new[1:] |= chunk[1:] != chunk[:-1]
    first = np.flatnonzero(new)
    run_chunk = chunk[first]
    run_whole = whole[run_chunk]
    lo = np.where(run_whole, 0, start[first])
    hi = np.where(run_whole, full[run_chunk], np.maximum.reduceat(end, first) - base[first])
    return _Plan(ids, chunk, start, length, checked, np.append(first, len(ids)),
                 lo.tolist(), hi.tolist(), run_chunk.tolist(), run_whole.tolist(), chunks)


async def read(fetcher: Fetcher, p: _Plan, out: list[Buffer]) -> None:
    """Every run of ``p`` from its chunk's first replica (recently failed targets
    last); a target that fails hands its extents to the failover path."""
    order = fetcher.client.plane.order_replicas
    by_target: dict[str, list[int]] = defaultdict(list)
    first: dict[int, str] = {}
    for r, c in enumerate(p.run_chunk):
        target = first.get(c)
        if target is None:
            target = first[c] = order(p.chunks[c][1])[0]
        by_target[target].append(r)
    failed = await gather_or_cancel(_read_target(fetcher, p, t, runs, out)
                                    for t, runs in by_target.items())
    rest = []
    for (target, runs), err in zip(by_target.items(), failed, strict=True):
        if err is None:
            continue
        for r in runs:
            for m in range(p.runs[r], p.runs[r + 1]):
                name, replicas, full, crc = p.chunks[p.chunk[m]]
                piece = fetcher.piece_at(int(p.ids[m]), name, replicas, full, crc,
                                         int(p.start[m]), int(p.length[m]))
                piece.mark(target)
                rest.append(piece)
    if rest:
        await fetcher.read_pieces(rest, out)


async def _read_target(fetcher: Fetcher, p: _Plan, target: str, runs: list[int],
                       out: list[Buffer]) -> BaseException | None:
    url = fetcher.url_of(target)
    if url is None:
        return TargetUnavailable(f"target {target} is unknown", target=target)
    ranged = [r for r in runs if not p.whole[r]]
    jobs = [_read_whole(fetcher, p, target, url, r, out) for r in runs if p.whole[r]]
    jobs.extend(_read_ranges(fetcher, p, target, url, request, out)
                for request in cut(ranged, [p.hi[r] - p.lo[r] for r in ranged],
                                   fetcher.options.max_request_bytes))
    try:
        await gather_or_cancel(jobs)
    except FAILOVER_ERRORS as exc:
        return exc
    return None


async def _read_ranges(fetcher: Fetcher, p: _Plan, target: str, url: str, runs: list[int],
                       out: list[Buffer]) -> None:
    items = [ReadItem(p.chunks[p.run_chunk[r]][0], p.lo[r], p.hi[r] - p.lo[r]) for r in runs]
    buf = bytearray(sum(i.length for i in items))
    view = memoryview(buf)
    patient = any(len(p.chunks[p.run_chunk[r]][1]) == 1 for r in runs)
    async with fetcher.client.limit:
        await fetcher.client.plane.batch_read_into(target, url, items, view, patient=patient)
    base = 0
    for r in runs:
        _hand_out(fetcher, p, r, view, base - p.lo[r], target, out)
        base += p.hi[r] - p.lo[r]


async def _read_whole(fetcher: Fetcher, p: _Plan, target: str, url: str, r: int,
                      out: list[Buffer]) -> None:
    name, replicas, full, crc = p.chunks[p.run_chunk[r]]
    assert crc is not None
    view = await fetcher.read_chunk(target, url, name, full, crc, patient=len(replicas) == 1)
    try:
        _hand_out(fetcher, p, r, view, 0, target, out)
    finally:
        fetcher.give_back(view)


def _hand_out(fetcher: Fetcher, p: _Plan, r: int, view: memoryview, shift: int, target: str,
              out: list[Buffer]) -> None:
    """Copy run ``r``'s extents out of ``view`` (chunk offset ``o`` at ``o + shift``)."""
    a, b = int(p.runs[r]), int(p.runs[r + 1])
    ids, starts, lengths = p.ids[a:b].tolist(), p.start[a:b].tolist(), p.length[a:b].tolist()
    if p.checked[a:b].any():        # a whole small chunk: checked against its CRC32C
        name, _, _, crc = p.chunks[p.run_chunk[r]]
        for start, length, whole in zip(starts, lengths, p.checked[a:b].tolist(),
                                        strict=True):
            if whole and crc32c(view[start + shift:start + shift + length]) != crc:
                fetcher.client.plane.counter(target).errors += 1
                raise CorruptChunk(f"chunk {name} from target {target} failed its CRC32C",
                                   chunk=name, target=target)
    for i, start, length in zip(ids, starts, lengths, strict=True):
        out[i] = bytes(view[start + shift:start + shift + length])


def cut(runs: list[T], sizes: list[int], limit: int) -> list[list[T]]:
    """Runs (of ``sizes`` bytes) cut into requests of at most ``limit`` bytes (a
    bigger run goes alone)."""
    out: list[list[T]] = []
    size = 0
    for run, n in zip(runs, sizes, strict=True):
        if not out or size + n > limit:
            out.append([])
            size = 0
        out[-1].append(run)
        size += n
    return out
