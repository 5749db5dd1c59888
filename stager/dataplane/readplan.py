"""Read plans: which bytes of which chunk go to which place in which buffer.

Every read of committed files (the striped reader, fsspec's ``cat_ranges``, the
Loader's fetches, the mount through the reader) is first written as a plan and
then handed to the one executor, :class:`~stager.dataplane.engine.ReadEngine`.
A plan is a handful of numpy arrays, one row per chunk piece, plus a small
table of the chunks they touch: a Loader batch is thousands of 16 KiB extents,
and one Python object per piece made planning the bottleneck of the I/O thread
(and kept the garbage collector busy while batches waited in the prefetch
window).  Cutting extents into chunk pieces is done here, as arrays, for every
caller alike.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..layout import chunk_length, chunk_targets, pieces
from ..protocol.cache import FillItem
from ..protocol.models import FileInfo, chunk_id, parse_chunk_id


@dataclass(frozen=True)
class ReadOptions:
    """How the executor turns a plan into requests (see ``ReadEngine``)."""

    stream_above: int = 512 << 10       # chunks this large, wanted whole: GET (sendfile);
                                        # the Loader's samples this large are large
    merge_gap: int = 16 << 10           # merge pieces of one chunk closer than this
    max_request_bytes: int = 8 << 20    # split a target's batch past this
    retries: int = 2
    bytes_in_flight: int = 32 << 20     # reads of the prefetch window out at once (two
                                        # fetch groups of small samples: this each); also
                                        # the most reused whole-chunk buffers kept
    # pieces covering this much of a chunk of at least stream_above bytes (a merged
    # run, or all of a plan's pieces in it): GET the whole chunk
    whole_chunk_above: float = 0.75

    def reads_whole(self, full: Any, covered: Any) -> Any:
        """Whether a chunk of ``full`` bytes, ``covered`` of which are wanted, is read
        whole (element-wise on numpy arrays); its CRC32C must be known as well."""
        return (full >= self.stream_above) & (covered >= self.whole_chunk_above * full)


@dataclass(frozen=True)
class Chunks:
    """The chunks a plan touches, one row each."""

    name: list[str]
    replicas: list[tuple[str, ...]]
    full: np.ndarray                 # the chunk's length
    crc: list[int | None]            # its committed CRC32C (None: not known)
    known: np.ndarray                # crc is not None
    urls: dict[str, str]             # target id -> URL, for every file of the plan
    cached: np.ndarray               # of a file of an attached directory: filled first

    def fill_items(self, rows: Sequence[int], again: Collection[int] = ()) -> list[FillItem]:
        """The fill request for chunks ``rows`` (of cached files): one item per file,
        ``again`` those of them to fetch anew."""
        items: dict[str, tuple[list[int], list[int]]] = {}
        for c in rows:
            file_id, index = parse_chunk_id(self.name[c])
            chunks, anew = items.setdefault(file_id, ([], []))
            chunks.append(index)
            if c in again:
                anew.append(index)
        return [FillItem(f, tuple(c), tuple(a)) for f, (c, a) in items.items()]

    def filled(self, rows: Sequence[int], crc: Sequence[int]) -> None:
        """Chunks ``rows`` are filled, with these CRC32Cs: reads check against them."""
        for c, value in zip(rows, crc, strict=True):
            self.crc[c] = value
            self.known[c] = True


@dataclass(frozen=True)
class ReadPlan:
    """One row per piece: ``length`` bytes of chunk ``chunk`` from ``offset`` go to
    destination ``dest`` at ``at``.  A piece marked ``alone`` is all of its
    destination and is handed out as ``bytes`` of its own (one copy, no
    preallocated buffer); the others are written into the destination buffer.
    Rows are sorted by chunk, then offset: the pieces of chunk ``c`` are rows
    ``bounds[c]`` to ``bounds[c + 1]``."""

    chunk: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    dest: np.ndarray
    at: np.ndarray
    alone: np.ndarray
    bounds: np.ndarray
    chunks: Chunks

    def __len__(self) -> int:
        return len(self.chunk)

    def part(self, a: int, b: int) -> ReadPlan:
        """The pieces of chunks ``a`` to ``b - 1`` only, as a plan of their own (into
        the same destinations)."""
        lo, hi = int(self.bounds[a]), int(self.bounds[b])
        c = self.chunks
        return ReadPlan(self.chunk[lo:hi] - a, self.offset[lo:hi], self.length[lo:hi],
                        self.dest[lo:hi], self.at[lo:hi], self.alone[lo:hi],
                        self.bounds[a:b + 1] - lo,
                        Chunks(c.name[a:b], c.replicas[a:b], c.full[a:b], c.crc[a:b],
                               c.known[a:b], c.urls, c.cached[a:b]))


class FileTable:
    """The files a reader plans against; remembers each chunk's id, replicas,
    length and checksum once worked out (a Loader plans against the same
    files for a whole epoch)."""

    def __init__(self, files: Sequence[FileInfo]) -> None:
        self.files = files
        self.urls: dict[str, str] = {}
        for f in files:
            self.urls.update(f.locations)
        # chunk size per file (0: not a file) and its size, for planning as arrays
        self.chunk_size = np.array([f.layout.chunk_size if f.layout is not None
                                    and f.file_id is not None else 0 for f in files],
                                   dtype=np.int64)
        self.size = np.array([f.size for f in files], dtype=np.int64)
        self._where: dict[int, tuple[str, tuple[str, ...], int, int | None, bool]] = {}

    def file_ids(self, rows: np.ndarray) -> set[str]:
        """The file ids of the files numbered ``rows`` (repeats and all)."""
        files = self.files
        return {fid for r in np.unique(rows).tolist()
                if (fid := files[r].file_id) is not None}

    def file_ids_by_target(self, rows: np.ndarray) -> list[str]:
        """:meth:`file_ids`, those whose first chunk lives on one target together: the
        order a plan's capabilities are fetched in, so that a batch capability covers
        files read from the same data server, and each request carries few."""
        files = self.files
        found = [(f.layout.targets[0] if f.layout is not None and f.layout.targets else "",
                  fid) for r in np.unique(rows).tolist()
                 if (fid := (f := files[r]).file_id) is not None]
        return [fid for _, fid in sorted(found)]

    def where(self, key: int) -> tuple[str, tuple[str, ...], int, int | None, bool]:
        """Chunk ``key & 0xFFFFFFFF`` of file number ``key >> 32``: its id,
        replicas, length, committed CRC32C, and whether its file is cached."""
        where = self._where.get(key)
        if where is None:
            info = self.files[key >> 32]
            index = key & 0xFFFFFFFF
            assert info.layout is not None and info.file_id is not None
            sums = info.checksums
            where = self._where[key] = (
                chunk_id(info.file_id, index), tuple(chunk_targets(info.layout, index)),
                chunk_length(info.layout.chunk_size, info.size, index),
                sums[index] if sums and index < len(sums) else None, info.layout.cached)
        return where

    def plan(self, file: np.ndarray, offset: np.ndarray, length: np.ndarray, *,
             alone: bool = True) -> ReadPlan:
        """Extent ``i`` (``length[i]`` bytes of file ``file[i]`` from ``offset[i]``)
        into destination ``i``.  ``alone``: an extent that is one piece is handed
        out as bytes of its own (else every destination is a caller's buffer)."""
        file = np.asarray(file, dtype=np.int64)
        offset = np.asarray(offset, dtype=np.int64)
        length = np.asarray(length, dtype=np.int64)
        self._check(file, offset, length)
        ids = np.flatnonzero(length > 0)
        file, offset, length = file[ids], offset[ids], length[ids]
        cs = self.chunk_size[file]
        first = offset // cs
        count = (offset + length - 1) // cs - first + 1
        if len(count) and count.max() == 1:         # the usual case: inside one chunk each
            ext, index, lo, hi = np.arange(len(ids)), first, offset, offset + length
        else:
            ext = np.repeat(np.arange(len(ids)), count)
            index = first[ext] + np.arange(len(ext)) - np.repeat(np.cumsum(count) - count,
                                                                 count)
            base = index * cs[ext]
            lo = np.maximum(offset[ext], base)
            hi = np.minimum(offset[ext] + length[ext], base + cs[ext])
        key = (file[ext] << 32) | index
        step = key[1:] - key[:-1]
        if not ((step > 0) | ((step == 0) & (lo[1:] >= lo[:-1]))).all():
            order = np.lexsort((lo, key))          # by chunk, then offset
            ext, index, lo, hi, key = ext[order], index[order], lo[order], hi[order], key[order]
        new = np.empty(len(key), dtype=bool)
        new[:1] = True
        np.not_equal(key[1:], key[:-1], out=new[1:])
        bounds = np.flatnonzero(new)
        chunks = self._chunks(key[bounds].tolist())
        single = count[ext] == 1 if alone else np.zeros(len(ext), dtype=bool)
        return ReadPlan(np.cumsum(new) - 1, lo - index * cs[ext], hi - lo, ids[ext],
                        lo - offset[ext], single, np.append(bounds, len(key)), chunks)

    def plan_range(self, file: int, start: int, stop: int) -> ReadPlan:
        """Bytes ``[start, stop)`` of file number ``file`` into destination 0 (a
        caller's buffer) at 0: the striped reader's plan, a few chunk pieces,
        built without the array machinery that pays off only for many extents."""
        info = self.files[file]
        assert info.layout is not None
        got = list(pieces(info.layout.chunk_size, info.size, start, stop))
        n = len(got)
        offset, length, at = np.array([(p.offset, p.length, p.file_offset - start)
                                       for p in got], dtype=np.int64).reshape(n, 3).T
        return ReadPlan(np.arange(n), offset, length, np.zeros(n, dtype=np.int64), at,
                        np.zeros(n, dtype=bool), np.arange(n + 1),
                        self._chunks([file << 32 | p.index for p in got]))

    def _chunks(self, keys: list[int]) -> Chunks:
        rows = [self.where(k) for k in keys]
        crc = [r[3] for r in rows]
        return Chunks([r[0] for r in rows], [r[1] for r in rows],
                      np.array([r[2] for r in rows], dtype=np.int64), crc,
                      np.array([c is not None for c in crc], dtype=bool), self.urls,
                      np.array([r[4] for r in rows], dtype=bool))

    def _check(self, file: np.ndarray, offset: np.ndarray, length: np.ndarray) -> None:
        """A clear error for an extent of no file, or outside its file."""
        wanted = length > 0
        bad = wanted & (self.chunk_size[file] == 0)
        if bad.any():
            raise ValueError(f"{self.files[int(file[np.argmax(bad)])].path} is not a file")
        bad = wanted & ((offset < 0) | (offset + length > self.size[file]))
        if bad.any():
            i = int(np.argmax(bad))
            start, stop = int(offset[i]), int(offset[i] + length[i])
            info = self.files[int(file[i])]
            raise ValueError(f"extent [{start}, {stop}) is outside {info.path} "
                             f"({info.size} bytes)")
