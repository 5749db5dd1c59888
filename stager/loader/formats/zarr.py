"""``zarr``: one array (zarr v2 or v3, sharded or not); samples along axis 0,
batches as numpy arrays of shape ``(batch, *shape[1:])``.

A unit is one row of storage objects (chunks, or shards when sharded) along
axis 0: every object whose first grid index is ``u``.  Objects missing from the
namespace were never written and read as the fill value, as zarr does.
Decoding is zarr's own, over an in-memory store holding the metadata and the
fetched objects, so every codec zarr knows works.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...client import AsyncClient
from ...errors import BadRequest
from ..dataset import Dataset
from ..spans import Spans
from .base import Index

METADATA = ("zarr.json", ".zarray", ".zattrs")


def _open(docs: Mapping[str, bytes], chunks: Mapping[str, bytes] | None = None) -> Any:
    import zarr
    from zarr.core.buffer import default_buffer_prototype
    from zarr.storage import MemoryStore

    proto = default_buffer_prototype()
    store = {k: proto.buffer.from_bytes(v) for k, v in docs.items()}
    for k, v in (chunks or {}).items():
        store[k] = proto.buffer.from_bytes(v)
    try:
        return zarr.open_array(MemoryStore(store, read_only=True), mode="r")
    except (ValueError, TypeError, KeyError, FileNotFoundError) as exc:
        raise BadRequest(f"not a zarr array: {type(exc).__name__}: {exc}") from None


def _layout(docs: Mapping[str, bytes]) -> tuple[tuple[int, ...], str, int, list[list[str]]]:
    """(shape, dtype, rows per unit, object keys of each unit) of the array in ``docs``."""
    arr = _open(docs)
    if arr.ndim == 0:
        raise BadRequest("a zero-dimensional zarr array has no samples")
    storage = arr.shards or arr.chunks
    grid = [-(-n // c) for n, c in zip(arr.shape, storage, strict=True)]
    units = []
    for u in range(grid[0]):
        keys = [arr.metadata.encode_chunk_key((u, *rest))
                for rest in itertools.product(*(range(g) for g in grid[1:]))]
        units.append(keys)
    return tuple(arr.shape), str(arr.dtype), int(storage[0]), units


class ZarrIndex(Index):
    format = "zarr"
    decodes = True

    def __init__(self, source: Dataset, docs: dict[str, bytes]) -> None:
        shape, dtype, rows, unit_keys = _layout(docs)
        super().__init__([f.info for f in source.files], shape[0])
        self.docs = docs
        self.shape, self.dtype, self.rows = shape, np.dtype(dtype), rows
        where = {f.rel: i for i, f in enumerate(source.files)}
        # per unit: (object key, file number) of the objects that exist
        self.unit_files = [[(k, where[k]) for k in keys if k in where] for keys in unit_keys]
        # the same as arrays: unit u's objects are files ``_object_file[_first[u]:_first[u + 1]]``
        self._first = np.concatenate(([0], np.cumsum([len(u) for u in self.unit_files])
                                      )).astype(np.int64)
        self._object_file = np.array([f for u in self.unit_files for _, f in u], dtype=np.int64)
        self._sizes = np.array([f.size for f in self.files], dtype=np.int64)

    def block_starts(self) -> np.ndarray:
        return np.arange(0, self.n, self.rows, dtype=np.int64)

    def units_of(self, samples: np.ndarray) -> np.ndarray:
        return np.asarray(samples, dtype=np.int64) // self.rows

    def spans_of(self, units: np.ndarray) -> Spans:
        """Each unit's objects that exist, whole (none for a row never written)."""
        first = self._first[units]
        counts = self._first[units + 1] - first
        before = np.cumsum(counts) - counts              # where each unit's objects begin
        at = np.arange(int(counts.sum()), dtype=np.int64)
        files = self._object_file[np.repeat(first - before, counts) + at]
        return Spans(files, np.zeros(len(files), dtype=np.int64), self._sizes[files],
                     np.repeat(units, counts))

    def decode(self, unit: int, fetched: list[bytes]) -> np.ndarray:
        chunks = {k: bytes(b) for (k, _), b in zip(self.unit_files[unit], fetched, strict=True)}
        arr = _open(self.docs, chunks)
        lo = unit * self.rows
        return np.asarray(arr[lo:min(lo + self.rows, self.n)])

    def nbytes(self, decoded: Any) -> int:
        return int(decoded.nbytes)

    def sample(self, sample: int, unit: int, decoded: Any) -> np.ndarray:
        return np.array(decoded[sample - unit * self.rows])

    def batch(self, samples: np.ndarray, units: np.ndarray, decoded: Mapping[int, Any]) -> Any:
        out = np.empty((len(samples), *self.shape[1:]), dtype=self.dtype)
        for u in np.unique(units):
            mask = units == u
            out[mask] = decoded[int(u)][samples[mask] - int(u) * self.rows]
        return out


async def build_zarr(client: AsyncClient, source: Dataset, options: dict[str, Any]) -> ZarrIndex:
    names = {f.rel: f.info for f in source.files}
    docs = {}
    for name in METADATA:
        if name in names:
            docs[name] = bytes(await client.reader(names[name]).read())
    if "zarr.json" not in docs and ".zarray" not in docs:
        raise BadRequest(f"{source.path} is not a zarr array (no zarr.json or .zarray)")
    return await asyncio.to_thread(ZarrIndex, source, docs)
