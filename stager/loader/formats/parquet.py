"""``parquet``: rows of one or more Parquet files; batches are ``pyarrow.RecordBatch``
(or ``{column: numpy array}`` with ``output="numpy"``).

Each file's footer is read once (two small ranged reads); a unit is one row
group, fetched as the byte range of its column chunks and decoded by pyarrow
from a sparse file that holds only that range.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...aio import gather_or_cancel
from ...client import AsyncClient
from ...errors import BadRequest
from ...protocol.models import FileInfo
from ..dataset import Dataset
from ..spans import Spans
from .base import Index, SeekableRaw

SUFFIXES = (".parquet", ".pq")


class SparseFile(SeekableRaw):
    """A file of ``size`` bytes of which only ``[offset, offset + len(data))`` is present."""

    def __init__(self, size: int, offset: int, data: bytes) -> None:
        super().__init__()
        self.size, self.offset, self.data = size, offset, memoryview(data)
        self.pos = 0

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), self.size - self.pos))
        lo = self.pos - self.offset
        if lo < 0 or lo + n > len(self.data):
            raise OSError(f"read of [{self.pos}, {self.pos + n}) outside the fetched range")
        out[:n] = self.data[lo:lo + n]
        self.pos += n
        return n


def row_group_span(md: pq.FileMetaData, rg: int) -> tuple[int, int]:
    """Byte range ``[start, stop)`` of a row group's column chunks."""
    group = md.row_group(rg)
    lo, hi = None, 0
    for c in range(group.num_columns):
        col = group.column(c)
        start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
        lo = start if lo is None else min(lo, start)
        hi = max(hi, start + col.total_compressed_size)
    return (lo or 0), hi


class ParquetIndex(Index):
    format = "parquet"
    decodes = True

    def __init__(self, source: Dataset, metadata: list[pq.FileMetaData], output: str) -> None:
        units: list[tuple[int, int]] = []
        rows: list[int] = []
        for f, md in enumerate(metadata):
            for rg in range(md.num_row_groups):
                if md.row_group(rg).num_rows:
                    units.append((f, rg))
                    rows.append(md.row_group(rg).num_rows)
        self.unit_start = np.concatenate(([0], np.cumsum(rows, dtype=np.int64)))
        super().__init__([f.info for f in source.files], int(self.unit_start[-1]))
        self.metadata = metadata
        self.units = units
        self.output = output
        spans = [row_group_span(metadata[f], rg) for f, rg in units]
        self._file = np.array([f for f, _ in units], dtype=np.int64)
        self._lo = np.array([lo for lo, _ in spans], dtype=np.int64)
        self._hi = np.array([hi for _, hi in spans], dtype=np.int64)

    def block_starts(self) -> np.ndarray:
        return self.unit_start[:-1].copy()

    def units_of(self, samples: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.unit_start, samples, side="right") - 1

    def spans_of(self, units: np.ndarray) -> Spans:
        """A row group is one extent: the byte range of its column chunks."""
        lo = self._lo[units]
        return Spans(self._file[units], lo, self._hi[units] - lo, units)

    def decode(self, unit: int, fetched: list[bytes]) -> pa.Table:
        f, rg = self.units[unit]
        sparse = SparseFile(self.files[f].size, int(self._lo[unit]), fetched[0])
        return pq.ParquetFile(sparse, metadata=self.metadata[f]).read_row_group(rg)

    def nbytes(self, decoded: Any) -> int:
        return int(decoded.nbytes)

    def sample(self, sample: int, unit: int, decoded: Any) -> dict[str, Any]:
        row = decoded.slice(sample - int(self.unit_start[unit]), 1).to_pylist()[0]
        return dict(row)

    def batch(self, samples: np.ndarray, units: np.ndarray, decoded: Mapping[int, Any]) -> Any:
        order = list(dict.fromkeys(int(u) for u in units))
        base = {u: 0 for u in order}
        at = 0
        for u in order:
            base[u] = at
            at += decoded[u].num_rows
        table = pa.concat_tables([decoded[u] for u in order])
        rows = [base[int(u)] + int(s) - int(self.unit_start[int(u)])
                for s, u in zip(samples, units, strict=True)]
        picked = table.take(pa.array(rows, type=pa.int64())).combine_chunks()
        if self.output == "numpy":
            return {name: col.to_numpy(zero_copy_only=False)
                    for name, col in zip(picked.column_names, picked.columns, strict=True)}
        return pa.concat_batches(picked.to_batches())


async def read_footer(client: AsyncClient, info: FileInfo) -> pq.FileMetaData:
    if info.size < 12:
        raise BadRequest(f"{info.path} is too short to be a Parquet file")
    tail = bytes(await client.reader(info).read(info.size - 8, info.size))
    if tail[4:] != b"PAR1":
        raise BadRequest(f"{info.path} is not a Parquet file")
    length = struct.unpack("<I", tail[:4])[0]
    if length + 12 > info.size:
        raise BadRequest(f"{info.path} has a damaged Parquet footer")
    footer = bytes(await client.reader(info).read(info.size - 8 - length, info.size))
    try:
        return pq.read_metadata(pa.BufferReader(b"PAR1" + footer))
    except (pa.ArrowException, OSError) as exc:
        raise BadRequest(f"{info.path}: unreadable Parquet footer: {exc}") from None


async def build_parquet(client: AsyncClient, source: Dataset,
                        options: dict[str, Any]) -> ParquetIndex:
    files = [f for f in source.files if f.rel.endswith(SUFFIXES)]
    if not files:
        raise BadRequest(f"{source.path} holds no Parquet files")
    output = options.get("output", "arrow")
    if output not in ("arrow", "numpy"):
        raise ValueError(f"output must be 'arrow' or 'numpy', not {output!r}")
    metadata = await gather_or_cancel(read_footer(client, f.info) for f in files)
    schema = metadata[0].schema.to_arrow_schema()
    for f, md in zip(files, metadata, strict=True):
        if not md.schema.to_arrow_schema().equals(schema):
            raise BadRequest(f"{f.info.path} has another schema than {files[0].info.path}")
    kept = Dataset(source.path, source.is_dir, tuple(files), source.from_manifest)
    return ParquetIndex(kept, list(metadata), output)
