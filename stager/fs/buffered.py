"""File objects of the ``stager://`` filesystem.

Reading (:class:`StagerReadFile`): every read asks the client's file for
exactly the bytes it touches.  Once reads continue each other
(``SEQUENTIAL_RUN`` in a row), they are served by a striped readahead stream:
the next chunks are already in flight on their targets.  A Parquet reader's
footer and column-chunk reads therefore fetch only what they need, while a
loop of ``f.read(1 << 20)`` streams at the speed of all targets together.

Writing (:class:`StagerWriteFile`): the upload is created when the file is
opened (so ``"xb"`` fails at once on an existing file), each full chunk is
sent as it fills, and ``close`` commits.  An exception inside ``with``,
``discard()``, or a file dropped without ``close`` aborts the upload: nothing
becomes visible.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from fsspec.asyn import sync
from fsspec.caching import BaseCache
from fsspec.spec import AbstractBufferedFile

from ..client import AsyncClient, AsyncReadFile
from ..client.holder import schedule
from ..dataplane import StripedWriter
from ..protocol.models import FileInfo
from .info import to_fsspec

if TYPE_CHECKING:
    from .filesystem import StagerFileSystem

SEQUENTIAL_RUN = 2            # reads continuing each other before readahead starts
WRITE_BLOCK = 4 << 20         # bytes buffered before they go to the striped writer


class StagerReadFile(AbstractBufferedFile):
    """A seekable read-only file; fsspec's cache is off by default (see the module doc)."""

    def __init__(self, fs: StagerFileSystem, path: str, info: FileInfo, *,
                 block_size: int | None = None, cache_type: str = "none",
                 cache_options: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._afile: AsyncReadFile = sync(fs.loop, self._make, fs, info)
        self._lent = threading.Lock()     # a read's parts are lent until joined
        super().__init__(fs, path, "rb", block_size=block_size, cache_type=cache_type,
                         cache_options=cache_options, size=info.size, **kwargs)
        self.details = to_fsspec(info)

    @staticmethod
    async def _make(fs: StagerFileSystem, info: FileInfo) -> AsyncReadFile:
        # One large read is already fetched piece by piece in parallel; a stream
        # only pays off when more reads will follow, which a run predicts.
        return AsyncReadFile(fs.client, info, stream_after=SEQUENTIAL_RUN,
                             large_reads_stream=False, in_place=True)

    def _fetch_range(self, start: int, end: int) -> bytes:
        # A run of reads of whole chunks streams into the bytes they return (see
        # AsyncReadFile's in_place): one part, which the join returns as it is.
        # Other reads are joined here, on the caller's thread: the copy runs
        # (without the GIL, for large reads) while the I/O thread keeps the
        # readahead coming, and the result comes from this thread's malloc arena,
        # which keeps the memory of the reads before it.  Joined on the I/O thread,
        # 8 MiB reads faulted in fresh pages for about half of their bytes (126,000
        # faults per GB; 7,600 now) and cost 1.6 times the CPU per GB.  One read at
        # a time: the next refills the buffers of the parts before it (see
        # AsyncReadFile.read_parts).
        with self._lent:
            return b"".join(sync(self.fs.loop, self._pread, start, end))

    async def _pread(self, start: int, end: int) -> list[memoryview | bytes]:
        self._afile.seek(start)
        return await self._afile.read_parts(max(0, end - start), reuse=True)

    def readinto(self, b: Any) -> int:
        """Straight into ``b`` (fsspec's reads into a new ``bytes``, then copies that),
        unless a ``cache_type`` was asked for, whose cache then serves the read."""
        if type(self.cache) is not BaseCache:
            return super().readinto(b)
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        out = memoryview(b).cast("B")
        with self._lent:
            n = sync(self.fs.loop, self._preadinto, self.loc, out)
        self.loc += n
        return n

    async def _preadinto(self, start: int, out: memoryview) -> int:
        self._afile.seek(start)
        return await self._afile.readinto(out)

    def close(self) -> None:
        if not self.closed:
            super().close()
            schedule(self.fs.loop, self._afile.close)


class StagerWriteFile(AbstractBufferedFile):
    """A write-only file that becomes visible when ``close`` (or ``commit``) succeeds."""

    def __init__(self, fs: StagerFileSystem, path: str, mode: str, *,
                 block_size: int | None = None, autocommit: bool = True,
                 layout: Any = None, **kwargs: Any) -> None:
        super().__init__(fs, path, mode, block_size=block_size or WRITE_BLOCK,
                         autocommit=autocommit, **kwargs)
        self._ended = True            # until the upload exists: nothing to abort

        async def create() -> tuple[AsyncClient, str, StripedWriter]:
            client = fs.client
            return (client, *await client.create(path, layout=layout, overwrite=mode == "wb"))

        self._client, self._file_id, self._writer = sync(fs.loop, create)
        self._ended = False
        self.info_after: FileInfo | None = None

    def _initiate_upload(self) -> None:
        """Nothing to do: the upload was created when the file was opened."""

    def _upload_chunk(self, final: bool = False) -> bool:
        view = self.buffer.getbuffer()
        try:
            if view.nbytes:
                self._guard(lambda: self._writer.write(view))
        finally:
            view.release()
        if final and self.autocommit:
            self.commit()
        return True

    def commit(self) -> None:
        """Wait for every chunk, then make the file visible."""
        if not self._ended:
            self.info_after = self._guard(
                lambda: self._client.commit(self._file_id, self._writer))
            self._ended = True

    def discard(self) -> None:
        """Abandon the write; nothing becomes visible, and the file is closed."""
        self.closed = True
        if not self._ended:
            self._ended = True
            sync(self.fs.loop, lambda: self._client.abort(self._file_id, self._writer))

    def _guard(self, make: Any) -> Any:
        """Run ``make()`` on the loop; on failure abort the upload, then raise."""
        try:
            return sync(self.fs.loop, make)
        except BaseException:
            self.discard()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.close()
            return
        self.discard()

    def __del__(self) -> None:
        # Never commit from the garbage collector: a file nobody closed may be
        # half-written.  It may also run on the IO thread, where we cannot wait.
        if not getattr(self, "_ended", True):
            self._ended = True
            self.closed = True
            try:
                schedule(self.fs.loop, lambda: self._client.abort(self._file_id, self._writer))
            except RuntimeError:
                pass   # no loop any more (interpreter exit): the server collects the upload
