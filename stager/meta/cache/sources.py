"""The open source of each attachment, as the metadata server reads it.

One :class:`~stager.sources.source.Source` per attachment, opened with its storage
options (unsealed here, never sent anywhere) on first use and kept: an async
filesystem (http, s3) keeps its connection pool between fills.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...sources.open import open_source_off_loop
from ...sources.source import Source
from ..store.caching import AttachmentRecord
from .secrets import OptionsBox


class Sources:
    def __init__(self, box: OptionsBox, forbidden: Sequence[str]) -> None:
        self.box = box
        self.forbidden = tuple(forbidden)    # local directories no source may show
        self._open: dict[str, tuple[str, Source]] = {}
        self._forgotten: list[Source] = []      # closed at shutdown: a fill may read one

    async def open(self, record: AttachmentRecord) -> Source:
        """The source of ``record`` (opened again when the attachment changed)."""
        kept = self._open.get(record.path)
        if kept is not None and kept[0] == record.source:
            return kept[1]
        source = await open_source_off_loop(record.source, **self.box.open(record.options))
        self._open[record.path] = (record.source, source)
        if kept is not None:
            await kept[1].close()
        return source

    def forget(self, path: str) -> None:
        """Drop the source of ``path``; closed with the rest by :meth:`close` (a fill
        may still read it; left to the GC, an http session warns it was not closed)."""
        kept = self._open.pop(path, None)
        if kept is not None:
            self._forgotten.append(kept[1])

    async def close(self) -> None:
        for source in [s for _, s in self._open.values()] + self._forgotten:
            await source.close()
        self._open.clear()
        self._forgotten.clear()
