"""Extents as arrays: a Loader batch of thousands of small samples, one row each.

Planning thousands of extents one Python object at a time made the I/O thread
the bottleneck; as arrays they go straight into a read plan
(:meth:`stager.dataplane.readplan.FileTable.plan`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Spans:
    """Extents as arrays: ``length[i]`` bytes of file ``file[i]`` from ``offset[i]``."""

    file: np.ndarray
    offset: np.ndarray
    length: np.ndarray

    def __len__(self) -> int:
        return len(self.file)

    @property
    def nbytes(self) -> int:
        return int(self.length.sum())

    def take(self, which: np.ndarray) -> Spans:
        return Spans(self.file[which], self.offset[which], self.length[which])

    @classmethod
    def concat(cls, parts: list[Spans]) -> Spans:
        return cls(np.concatenate([p.file for p in parts]),
                   np.concatenate([p.offset for p in parts]),
                   np.concatenate([p.length for p in parts]))
