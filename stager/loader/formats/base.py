"""What every format tells the loader: samples, the units they are read in, and decoding.

A *unit* is what is fetched and decoded as a whole: a file (``files``), one
sample's tar members (``tar``), a row group (``parquet``), a row of chunks
along axis 0 (``zarr``).  Every format gives the byte extents of many units at
once as arrays (:meth:`Index.spans_of`), so thousands of small samples are
planned without an object each; the loader fetches them in one go, decodes
each unit once (in a thread pool) and builds batches from the decoded units.
An index is plain data (picklable), so a DataLoader worker started with
``spawn`` gets it too.
"""

from __future__ import annotations

import io
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...protocol.models import FileInfo
from ..spans import Spans


class Index(ABC):
    """A dataset as samples ``0 … n-1`` in manifest order."""

    format = ""
    decodes = False          # True when units need decoding (in the thread pool)
    # True when :meth:`batch` only arranges bytes already fetched (no decoding, no
    # columnar build): cheap enough to run on the I/O loop
    batch_inline = False

    def __init__(self, files: Sequence[FileInfo], n: int) -> None:
        self.files = tuple(files)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def block_starts(self) -> np.ndarray:
        """Natural shuffle blocks (first sample of each): samples read together cheaply."""
        return np.arange(self.n, dtype=np.int64)

    def units_of(self, samples: np.ndarray) -> np.ndarray:
        return np.asarray(samples, dtype=np.int64)

    @abstractmethod
    def spans_of(self, units: np.ndarray) -> Spans:
        """The extents of each of ``units`` (distinct), in that order, each with its unit."""
        raise NotImplementedError

    def per_unit(self, units: np.ndarray, spans: Spans, buffers: list[bytes]) -> list[Any]:
        """Each unit's fetched value (``buffers``: the bytes of each extent of
        ``spans``, which :meth:`spans_of` gave for ``units``): the list of its
        extents' bytes.  Formats whose unit is one extent keep its bytes alone."""
        return spans.split(units, buffers)

    def decode(self, unit: int, fetched: Any) -> Any:
        """Turn a unit's fetched value (see :meth:`per_unit`) into what
        :meth:`sample` reads from (formats with :attr:`decodes`)."""
        return fetched

    def nbytes(self, decoded: Any) -> int:
        """Memory a decoded unit holds (for the prefetch bound)."""
        return sum(len(b) for b in decoded)

    @abstractmethod
    def sample(self, sample: int, unit: int, decoded: Any) -> Any:
        raise NotImplementedError

    def batch(self, samples: np.ndarray, units: np.ndarray, decoded: Mapping[int, Any]) -> Any:
        """The default batch: a list of samples (formats override with a columnar one)."""
        return [self.sample(int(s), int(u), decoded[int(u)]) for s, u in zip(samples, units,
                                                                          strict=True)]


class SeekableRaw(io.RawIOBase):
    """A read-only, seekable raw file of ``size`` bytes at position ``pos``;
    subclasses provide ``readinto``."""

    size: int
    pos: int

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos
