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

from collections.abc import Sequence

from ..client import AsyncClient
from ..dataplane.engine import ReadEngine
from ..dataplane.readplan import FileTable
from ..dataplane.readplan import ReadOptions as FetchOptions
from ..errors import StagerError
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

    async def warm(self, spans: Spans) -> None:
        """Fetch, now, the capabilities the reads of ``spans`` will need (with auth on),
        so that fetching them overlaps the reads before instead of delaying these.
        A failure here is left for the reads themselves to meet and report."""
        try:
            await self.engine.plane.warm("read", self.table.file_ids_by_target(spans.file))
        except StagerError:
            pass

    async def fetch(self, spans: Spans) -> list[bytes]:
        """The bytes of each extent, in order.

        Each extent becomes ``bytes`` as soon as its own read is done (copied
        out of the request or read buffer, which is freed at once), so a batch
        never sits in memory twice and decoding needs no further copy.
        """
        return await self.engine.read_extents(self.table, spans.file, spans.offset,
                                              spans.length)
