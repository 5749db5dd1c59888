"""The Loader's reads: extents of the dataset's files, planned and run by the read engine.

A fetch is one read plan (:mod:`stager.dataplane.readplan`) over every extent
of a fetch group, handed to the one executor
(:class:`~stager.dataplane.engine.ReadEngine`): pieces grouped by the data
server that holds them, neighbours of one chunk merged, one batched request
per target (split past ``max_request_bytes``), chunks mostly wanted read whole
by ``sendfile`` into reused buffers, and replica failover with retries.  The
Fetcher only keeps what lives as long as the Loader: the files' chunk table and
the engine with its reused whole-chunk buffers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np

from ..client import AsyncClient
from ..dataplane.engine import ReadEngine
from ..dataplane.readplan import FileTable
from ..dataplane.readplan import ReadOptions as FetchOptions
from ..protocol.models import FileInfo
from .spans import Spans

Buffer = bytes | bytearray | memoryview

__all__ = ["Buffer", "FetchOptions", "Fetcher"]


class Fetcher:
    """Reads extents of the given files; one instance per loader, shared by its fetches."""

    def __init__(self, client: AsyncClient, files: Sequence[FileInfo],
                 options: FetchOptions | None = None) -> None:
        self.client = client
        self.files = files
        self.options = options or FetchOptions()
        self.table = FileTable(files)
        self.engine = ReadEngine(client.plane, client.limit, self.options)
        self._targets: np.ndarray | None = None     # see _by_target
        self._ids: list[str | None] = []

    def needs_capabilities(self) -> bool:
        """Whether reads show capabilities (auth on, as far as the client knows)."""
        credentials = self.engine.plane.credentials
        return credentials is not None and not getattr(credentials, "off", False)

    def warm_ahead(self, parts: Sequence[np.ndarray]) -> list[asyncio.Future[None]]:
        """Start fetching the capabilities for the files of the next batches
        (``parts``: each batch's file rows, in order), in one request, ordered by the
        data server that holds each file, then by batch; not waiting for them.  So each
        batch capability (up to 256 files) names one data server's files of a few
        consecutive batches: only that server verifies it, where a fetch group's own
        (its files over every server) was verified by all of them; and the metadata
        server answers one request for several groups.  The request is under way before
        the reads started after this call: the reads that need it wait for it, and meet
        its failure by asking again.  Returns the fetches under way for them."""
        credentials = self.engine.plane.credentials
        ask = getattr(credentials, "ask", None)
        if ask is None or not parts:
            return []
        rows = np.concatenate(parts)
        batch = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
        rows, first = np.unique(rows, return_index=True)
        targets, ids = self._by_target()
        order = rows[np.lexsort((batch[first], targets[rows]))]
        return ask("read", [f for f in map(ids.__getitem__, order.tolist()) if f is not None])

    def _by_target(self) -> tuple[np.ndarray, list[str | None]]:
        """Each file's data server (of its first chunk: a code) and its id, worked out
        once for the Loader's life."""
        if self._targets is None:
            codes: dict[str, int] = {}
            self._targets = np.array(
                [codes.setdefault(f.layout.targets[0] if f.layout is not None
                                  and f.layout.targets else "", len(codes))
                 for f in self.files], dtype=np.int64)
            self._ids = [f.file_id for f in self.files]
        return self._targets, self._ids

    async def fetch(self, spans: Spans) -> list[bytes]:
        """The bytes of each extent, in order.

        Each extent becomes ``bytes`` as soon as its own read is done (copied
        out of the request or read buffer, which is freed at once), so a batch
        never sits in memory twice and decoding needs no further copy.
        """
        return await self.engine.read_extents(self.table, spans.file, spans.offset,
                                              spans.length)
