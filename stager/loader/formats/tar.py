"""``tar``: WebDataset-compatible shards.  Samples are runs of members sharing a key.

A member ``dir/name.ext1.ext2`` belongs to sample ``dir/name`` as field
``ext1.ext2`` (lower-cased), as WebDataset groups them.  Each shard is indexed
once: its headers are walked over a ranged reader.  Dense headers (small
members) are read in windows, the next window read while this one is parsed;
the first header, and each one past a member of half a MiB or more, takes a
small read of its own, so large members are not read at all.  Plain ustar
headers are parsed here; a shard with any other kind (pax, GNU long names,
links) is read by Python's ``tarfile`` instead.  The offsets are cached in
memory and on local disk by file id (a committed file never changes, so the
cache is always valid).  Afterwards a sample is one byte range, from its
first member's data to its last member's end (the headers between its members
come along, 512 bytes each), and its fields are cut from it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import os
import re
import tarfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...client import AsyncClient
from ...errors import BadRequest
from ...protocol.models import FileInfo
from ..dataset import Dataset
from ..spans import Spans
from .base import Index, SeekableRaw

WINDOW = 4 << 20                 # bytes fetched per header window (one default chunk)
SPARSE_GAP = 512 << 10           # a read this far past the last one skipped a large member,
SMALL_READ = 64 << 10            # so read this much there, not the window holding it
INDEX_VERSION = 1
_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_MEMORY: dict[str, list[tuple[str, int, int]]] = {}     # file id -> members


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stager" / "tar-index"


def split_key(name: str) -> tuple[str, str] | None:
    """WebDataset's (key, extension) of a member name, or None when it has no extension."""
    m = _KEY_RE.match(name)
    return (m.group(1), m.group(2).lower()) if m else None


class TarIndex(Index):
    format = "tar"

    def __init__(self, source: Dataset, members: list[list[tuple[str, int, int]]]) -> None:
        keys: list[str] = []
        fields: list[tuple[str | int, ...]] = []
        shard: list[int] = []
        for s, listing in enumerate(members):
            for key, flat in _group(listing, source.files[s].rel):
                keys.append(key)
                fields.append(flat)
                shard.append(s)
        super().__init__([f.info for f in source.files], len(keys))
        self.keys = keys
        # Each sample's fields as one flat tuple of strings and numbers (extension,
        # offset, size, extension, ...): the garbage collector stops tracking such
        # a tuple the first time it looks at it.  Tuples of tuples stayed tracked
        # into the oldest generation, and an index of 65,536 samples set off full
        # collections (30-40 ms each here, all threads stopped) while the first
        # batches were read.
        self.fields = fields
        self.shard = np.asarray(shard, dtype=np.int32)
        self._shard_of = shard          # the same as Python ints (read per sample)
        self._paths = [f.path for f in self.files]
        # A sample is read as one extent, from its first member's data to its last
        # member's end (the headers between them come along: 512 bytes each).
        self._start = np.array([f[1] for f in fields], dtype=np.int64)
        self._stop = np.array([f[-2] + f[-1] for f in fields],  # type: ignore[operator]
                              dtype=np.int64)

    def block_starts(self) -> np.ndarray:
        """A block is the samples starting in one chunk of one shard."""
        if self.n == 0:
            return np.zeros(0, dtype=np.int64)
        sizes = np.array([self.files[s].layout.chunk_size  # type: ignore[union-attr]
                          for s in self.shard], dtype=np.int64)
        first = self._start // sizes
        change = (np.diff(self.shard) != 0) | (np.diff(first) != 0)
        return np.concatenate(([0], np.nonzero(change)[0] + 1)).astype(np.int64)

    batch_inline = True

    def spans_of(self, units: np.ndarray) -> Spans:
        start = self._start[units]
        return Spans(self.shard[units].astype(np.int64), start, self._stop[units] - start,
                     units)

    def per_unit(self, units: np.ndarray, spans: Spans, buffers: list[bytes]) -> list[Any]:
        """A sample is one extent: its value is its bytes (no list per sample)."""
        return buffers

    def sample(self, sample: int, unit: int, decoded: Any) -> dict[str, Any]:
        """The sample's fields, cut from its bytes (``decoded``, from its first
        member's data to its last member's end)."""
        out: dict[str, Any] = {"__key__": self.keys[sample], "__index__": sample,
                               "__url__": self._paths[self._shard_of[sample]]}
        f: Any = self.fields[sample]
        if len(f) == 3:
            out[f[0]] = bytes(decoded)
            return out
        base = f[1]
        for i in range(0, len(f), 3):
            ext, off, size = f[i:i + 3]
            out[ext] = bytes(decoded[off - base:off - base + size])
        return out

    def batch(self, samples: np.ndarray, units: np.ndarray, decoded: Mapping[int, Any]) -> Any:
        """:meth:`sample` of each (a sample is its own unit), without a call per
        sample for the usual one-field sample."""
        keys, fields, shard, paths = self.keys, self.fields, self._shard_of, self._paths
        out = []
        for s in samples.tolist():
            f = fields[s]
            if len(f) == 3:
                out.append({"__key__": keys[s], "__index__": s, "__url__": paths[shard[s]],
                            f[0]: decoded[s]})
            else:
                out.append(self.sample(s, s, decoded[s]))
        return out


def _group(listing: list[tuple[str, int, int]], shard: str
           ) -> Iterator[tuple[str, tuple[str | int, ...]]]:
    """Consecutive members with one key make one sample: its key and its fields as
    one flat tuple (extension, offset, size, extension, ...)."""
    current: list[str | int] = []
    key = None
    for name, offset, size in listing:
        split = split_key(name)
        if split is None:
            continue
        k, ext = split
        if k != key:
            if current:
                yield key, tuple(current)  # type: ignore[misc]
            key, current = k, []
        if ext in current[::3]:
            raise BadRequest(f"tar shard {shard}: sample {k!r} has field {ext!r} twice")
        current += (ext, offset, size)
    if current:
        yield key, tuple(current)  # type: ignore[misc]


class _WindowedFile(SeekableRaw):
    """A read-only file over a stager file, read in aligned windows from another thread."""

    def __init__(self, client: AsyncClient, info: FileInfo,
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.reader = client.reader(info)
        self.size = info.size
        self.loop = loop
        self.pos = 0
        self.read_end = 0                   # where the last read ended
        self.window_at = -1
        self.window = b""
        self.ahead: tuple[int, cf.Future[bytearray]] | None = None   # the next window

    def _window(self, at: int) -> None:
        """Make ``[at, at + WINDOW)`` the current window; start reading the next one."""
        ahead = self.ahead
        if ahead is not None and ahead[0] == at:
            future = ahead[1]
        else:
            if ahead is not None:
                ahead[1].cancel()
            future = self._start(at)
        self.ahead = (at + WINDOW, self._start(at + WINDOW)) if at + WINDOW < self.size \
            else None
        self.window, self.window_at = bytes(future.result()), at

    def _small(self, at: int) -> None:
        """Make ``[at, at + SMALL_READ)`` the current window (no read-ahead): the
        header after a large member, without the member's bytes around it."""
        self.window = bytes(self._start(at, SMALL_READ).result())
        self.window_at = at

    def _start(self, at: int, size: int = WINDOW) -> cf.Future[bytearray]:
        return asyncio.run_coroutine_threadsafe(self.reader.read(at, at + size), self.loop)

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead[1].cancel()
            self.ahead = None
        super().close()

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), self.size - self.pos))
        done = 0
        while done < n:
            inside = self.pos - self.window_at
            if not 0 <= inside < len(self.window):
                if self.window_at < 0 or self.pos - self.read_end >= SPARSE_GAP:
                    self._small(self.pos)       # the first header, or one past a large member
                else:
                    self._window((self.pos // WINDOW) * WINDOW)
                inside = self.pos - self.window_at
            take = min(n - done, len(self.window) - inside)
            out[done:done + take] = self.window[inside:inside + take]
            done += take
            self.pos += take
        self.read_end = self.pos
        return done


_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
_REGULAR = frozenset(b"07\0")          # regular file types (tarfile.REGULAR_TYPES, less sparse)
_DIRECTORY = ord("5")


def _plain_members(f: SeekableRaw) -> list[tuple[str, int, int]] | None:
    """The regular members of a tar made of plain headers only (ustar or v7,
    regular files and directories, unsigned checksums): what ``tarfile`` would
    list, at a third of its cost per header.  ``None`` for anything else (pax or
    GNU extension headers, links, sparse files, a bad or truncated header, an
    empty archive), which ``tarfile`` then reads, with its own rules and errors."""
    members = []
    header = bytearray(_BLOCK)
    pos = 0
    while pos < f.size:
        f.seek(pos)
        if f.readinto(header) != _BLOCK:
            return None
        if header == _ZERO_BLOCK:
            break                                   # the end-of-archive marker
        kind = header[156]
        if kind not in _REGULAR and kind != _DIRECTORY:
            return None
        try:
            stored, size = int(_field(header, 148, 156) or "0", 8), \
                int(_field(header, 124, 136) or "0", 8)
        except ValueError:
            return None                             # base-256 or not a number
        if stored != sum(header) - sum(header[148:156]) + 256:
            return None
        name = _text(header, 0, 100)
        if kind == _DIRECTORY or (kind == 0 and name.endswith("/")):
            size = 0                                # a directory (v7 marks it with a slash)
        else:
            prefix = _text(header, 345, 500)
            members.append((f"{prefix}/{name}" if prefix else name, pos + _BLOCK, size))
        pos += _BLOCK + -(-size // _BLOCK) * _BLOCK
    return members if pos else None


def _field(header: bytearray, start: int, stop: int) -> str:
    """A numeric field's octal digits (``tarfile.nti``, less base-256): ASCII only,
    as there (``int`` would take other scripts' digits too)."""
    return bytes(header[start:stop]).split(b"\0", 1)[0].decode("ascii").strip()


def _text(header: bytearray, start: int, stop: int) -> str:
    """A text field as ``tarfile`` decodes it (``nts``: UTF-8, surrogateescape)."""
    return bytes(header[start:stop]).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _scan(f: SeekableRaw, name: str) -> list[tuple[str, int, int]]:
    plain = _plain_members(f)
    if plain is not None:
        return plain
    f.seek(0)
    members = []
    try:
        with tarfile.open(fileobj=f, mode="r:") as tar:  # type: ignore[call-overload]
            for m in tar:
                if m.isfile():
                    members.append((m.name, m.offset_data, m.size))
    except tarfile.TarError as exc:
        raise BadRequest(f"{name} is not a readable tar file: {exc}") from None
    return members


async def index_shard(client: AsyncClient, info: FileInfo,
                      cache: Path | None) -> list[tuple[str, int, int]]:
    """The (name, data offset, size) of every regular member of one shard."""
    assert info.file_id is not None
    hit = _MEMORY.get(info.file_id)
    if hit is not None:
        return hit
    path = cache / f"{info.file_id}.json" if cache is not None else None
    if path is not None:
        members = await asyncio.to_thread(_load_cached, path)
        if members is not None:
            _MEMORY[info.file_id] = members
            return members
    f = _WindowedFile(client, info, asyncio.get_running_loop())
    try:
        members = await asyncio.to_thread(_scan, f, info.path)
    finally:
        f.close()
    _MEMORY[info.file_id] = members
    if path is not None:
        await asyncio.to_thread(_store_cached, path, members)
    return members


def _load_cached(path: Path) -> list[tuple[str, int, int]] | None:
    try:
        body = json.loads(path.read_text())
        if body.get("version") != INDEX_VERSION:
            return None
        return [(str(n), int(o), int(s)) for n, o, s in body["members"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None        # missing or damaged: index again


def _store_cached(path: Path, members: list[tuple[str, int, int]]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": INDEX_VERSION, "members": members}))
        os.replace(tmp, path)
    except OSError:
        pass               # a cache that cannot be written costs a re-index, nothing else


async def build_tar(client: AsyncClient, source: Dataset, options: dict[str, Any]) -> TarIndex:
    shards = [f for f in source.files if f.rel.endswith(".tar")]
    if not shards:
        raise BadRequest(f"{source.path} holds no .tar shards")
    kept = Dataset(source.path, source.is_dir, tuple(shards), source.from_manifest)
    cache = options.get("index_cache", default_cache_dir())
    cache = Path(cache) if cache is not None else None
    sem = asyncio.Semaphore(8)

    async def one(info: FileInfo) -> list[tuple[str, int, int]]:
        async with sem:
            return await index_shard(client, info, cache)

    members = await asyncio.gather(*(one(f.info) for f in shards))
    return TarIndex(kept, list(members))
