"""``files``: every file is a sample.

A sample is ``{"__key__": path relative to the source, "__index__": i, "data": bytes}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..dataset import Dataset
from ..spans import Spans
from .base import Index


class FilesIndex(Index):
    format = "files"
    batch_inline = True

    def __init__(self, source: Dataset) -> None:
        super().__init__([f.info for f in source.files], len(source.files))
        self.keys = source.names()
        self._sizes = np.array([f.size for f in self.files], dtype=np.int64)

    def spans_of(self, units: np.ndarray) -> Spans:
        return Spans(units, np.zeros(len(units), dtype=np.int64), self._sizes[units], units)

    def per_unit(self, units: np.ndarray, spans: Spans, buffers: list[bytes]) -> list[Any]:
        """A file is one extent: its value is its bytes."""
        return buffers

    def sample(self, sample: int, unit: int, decoded: Any) -> dict[str, Any]:
        return {"__key__": self.keys[sample], "__index__": sample, "data": bytes(decoded)}

    def batch(self, samples: np.ndarray, units: np.ndarray, decoded: Mapping[int, Any]) -> Any:
        keys = self.keys
        return [{"__key__": keys[s], "__index__": s, "data": decoded[s]}
                for s in samples.tolist()]


async def build_files(client: Any, source: Dataset, options: dict[str, Any]) -> FilesIndex:
    return FilesIndex(source)
