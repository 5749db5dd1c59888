"""Resolved dataset manifests, encoded once and served many times.

A job of 1,000 ranks opening one 100,000-file dataset asks for its manifest
1,000 times at once.  Resolving it walks the whole subtree and encodes megabytes
of JSON (seconds of CPU); this cache makes that happen once per change of the
dataset, and every other request costs one small query and a copy of bytes.

The key says exactly when a resolution is stale, from the store: the manifest's
:class:`~.store.base.ManifestVersion` (its directory row, its ``gen``, which every
change visible to the resolution bumps in its own transaction, and when it was
stored), the path asked for (a rename of the dataset moves it), and the URL of
every registered target (a target that moves must not leave stale locations in
a cached answer).  The ETag is a digest of the key, so the metadata servers that
share a store give the same ETag for the same state, and a client revalidates
with whichever it reaches without either resolving anything.

Misses of one key that arrive together share one resolution (single flight); the
entries are kept least recently used first out, within a byte budget
(``Config.manifest_cache_bytes``), and a newer version of a path replaces the older.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..protocol.models import Layout
from .store.base import ManifestVersion, NodeEntry

# Resolving happens once per change, but the first rank of a job waits on it: the
# fastest level keeps that short (a 100,000-file manifest compresses ~10x even so).
GZIP_LEVEL = 1


@dataclass(frozen=True)
class Snapshot:
    """A resolved manifest as served: its JSON, gzip'd, and its ETag."""

    etag: str
    gzipped: bytes
    size: int                       # of the JSON before compression

    def json_bytes(self) -> bytes:
        """The plain JSON (CPU: call it in a thread for a large manifest)."""
        return gzip.decompress(self.gzipped)


def etag_of(path: str, version: ManifestVersion, urls: Mapping[str, str]) -> str:
    """The ETag of the resolution of ``path``'s manifest at ``version`` with the
    targets at ``urls``: weak, as servers may order the same content differently."""
    key = json.dumps([path, version.dir_id, version.gen, version.created,
                      sorted(urls.items())])
    return 'W/"' + hashlib.blake2b(key.encode(), digest_size=16).hexdigest() + '"'


def encode(etag: str, body: Mapping[str, Any]) -> Snapshot:
    """Encode a resolved manifest once (CPU: in a thread)."""
    raw = json.dumps(body, separators=(",", ":")).encode()
    return Snapshot(etag, gzip.compress(raw, compresslevel=GZIP_LEVEL, mtime=0), len(raw))


class SnapshotCache:
    """Snapshots by ETag within ``budget`` bytes (compressed), least recently used out."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.resolutions = 0            # snapshots made (tests, benchmarks)
        self.hits = 0                   # answers from a cached one
        self._entries: OrderedDict[str, Snapshot] = OrderedDict()
        self._by_path: dict[str, str] = {}
        self._bytes = 0
        self._flights: dict[str, asyncio.Task[Snapshot]] = {}

    def peek(self, etag: str) -> Snapshot | None:
        return self._entries.get(etag)

    async def get(self, path: str, etag: str,
                  make: Callable[[], Awaitable[Snapshot]]) -> Snapshot:
        """The snapshot of ``etag``: cached, or made by ``make()`` once for all the
        callers that ask meanwhile (one of them going away does not cancel it)."""
        hit = self._entries.get(etag)
        if hit is not None:
            self._entries.move_to_end(etag)
            self.hits += 1
            return hit
        flight = self._flights.get(etag)
        if flight is None:
            flight = asyncio.get_running_loop().create_task(make())
            self._flights[etag] = flight
            self.resolutions += 1
            flight.add_done_callback(lambda done: self._landed(path, etag, done))
        return await asyncio.shield(flight)

    def _landed(self, path: str, etag: str, flight: asyncio.Task[Snapshot]) -> None:
        del self._flights[etag]
        if flight.cancelled() or flight.exception() is not None:
            return          # (exception() also marks it seen, should every caller be gone)
        snapshot = flight.result()
        older = self._by_path.get(path)
        if older is not None and older != etag:
            self._drop(older)
        if snapshot.etag in self._entries or len(snapshot.gzipped) > self.budget:
            return
        self._entries[etag] = snapshot
        self._by_path[path] = etag
        self._bytes += len(snapshot.gzipped)
        while self._bytes > self.budget:
            self._drop(next(iter(self._entries)))

    def _drop(self, etag: str) -> None:
        gone = self._entries.pop(etag, None)
        if gone is not None:
            self._bytes -= len(gone.gzipped)
        for path, current in list(self._by_path.items()):
            if current == etag:
                del self._by_path[path]


def resolve(path: str, blob: bytes, created: float, live: Mapping[str, NodeEntry],
            urls: Mapping[str, str]) -> dict[str, Any]:
    """Unpack a stored manifest and resolve it against the live files (CPU work: runs
    in a thread, so a large manifest never holds the event loop)."""
    stored = json.loads(zlib.decompress(blob))
    layouts: dict[Layout, int] = {}
    files = []
    for f in stored["files"]:
        entry = live.get(f["path"])
        if entry is None or entry.file_id != f["file_id"] or entry.layout is None:
            files.append({**f, "stale": True})
            continue
        index = layouts.setdefault(entry.layout, len(layouts))
        files.append({**f, "layout": index,
                      "checksums": [f"{c:08x}" for c in entry.checksums or ()]})
    targets = {t for layout in layouts for t in layout.targets}
    return {**stored, "path": path, "created": created, "files": files,
            "layouts": [layout.to_json() for layout in layouts],
            "locations": {t: urls[t] for t in targets if t in urls}}
