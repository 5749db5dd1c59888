"""``files``: every file is a sample.

A sample is ``{"__key__": path relative to the source, "__index__": i, "data": bytes}``.
"""

from __future__ import annotations

from typing import Any

from ..fetch import Extent
from ..source import Source
from .base import Index


class FilesIndex(Index):
    format = "files"

    def __init__(self, source: Source) -> None:
        super().__init__([f.info for f in source.files], len(source.files))
        self.keys = source.names()

    def extents(self, unit: int) -> list[Extent]:
        return [Extent(unit, 0, self.files[unit].size)]

    def extents_of(self, units: list[int]) -> list[list[Extent]]:
        files = self.files
        return [[Extent(u, 0, files[u].size)] for u in units]

    def sample(self, sample: int, unit: int, decoded: Any) -> dict[str, Any]:
        return {"__key__": self.keys[sample], "__index__": sample, "data": bytes(decoded[0])}


async def build_files(client: Any, source: Source, options: dict[str, Any]) -> FilesIndex:
    return FilesIndex(source)
