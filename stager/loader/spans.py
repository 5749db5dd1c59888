"""Extents as arrays: a Loader batch of thousands of small samples, one row each.

Planning thousands of extents one Python object at a time made the I/O thread
the bottleneck; as arrays they go straight into a read plan
(:meth:`stager.dataplane.readplan.FileTable.plan`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


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
    def of(cls, extents: Iterable[tuple[int, int, int]]) -> Spans:
        """Extents given as ``(file, offset, length)`` rows."""
        rows = np.array(list(extents), dtype=np.int64).reshape(-1, 3)
        return cls(rows[:, 0], rows[:, 1], rows[:, 2])

    @classmethod
    def concat(cls, parts: list[Spans]) -> Spans:
        units = [p.unit for p in parts]
        return cls(np.concatenate([p.file for p in parts]),
                   np.concatenate([p.offset for p in parts]),
                   np.concatenate([p.length for p in parts]),
                   None if any(u is None for u in units)
                   else np.concatenate(units))  # type: ignore[arg-type]
