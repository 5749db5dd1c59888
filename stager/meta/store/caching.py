"""The store's cache role (:mod:`stager.meta.cache`): attached directories, their files,
and which of their chunks are filled, with the records it answers in.  One of the roles
:class:`~stager.meta.store.base.MetaStore` joins."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class AttachmentRecord:
    """An attached directory: a view of the source URL ``source`` (stager/meta/cache)."""

    path: str                       # the stager directory
    source: str                     # the fsspec URL it shows
    options: bytes                  # the source's storage options, encrypted
    refresh: float | None           # seconds between listings (None: on demand only)
    include: tuple[str, ...]        # globs a source path must match (none: every path)
    exclude: tuple[str, ...]        # globs no source path may match
    listed: float                   # when the source was last listed (0: never)
    created: float
    hits: int = 0                   # chunk reads served from the cache
    misses: int = 0                 # chunk reads that fetched from the source


@dataclass(frozen=True)
class CachedFile:
    """A file of an attached directory: a committed entry whose chunks are filled
    from ``key`` of the attachment's source on first read."""

    file_id: str
    attachment: str                 # the attached directory's path
    path: str                       # the file's stager path
    key: str                        # its path in the source
    version: str                    # the source's ETag, else "size:mtime"


@dataclass(frozen=True)
class CachedChunk:
    """A chunk of a cached file filled from its source (eviction's candidates)."""

    file_id: str
    index: int
    size: int
    crc: int
    filled: float
    used: float                     # last fill or read reported
    path: str                       # the file's stager path (pins are by path)
    attachment: str


class Caching(ABC):
    """Attached directories, their files, and which chunks are filled
    (:mod:`stager.meta.cache`).  A chunk row with a ``crc`` is filled; one without is a
    fill under way, leased to one ``holder`` until ``until`` so that one metadata
    server fetches each chunk while the others wait for the row."""

    @abstractmethod
    async def put_attachment(self, record: AttachmentRecord) -> None:
        """Add the attachment, or replace the one at its path (counts kept)."""

    @abstractmethod
    async def attachments(self) -> list[AttachmentRecord]:
        """Every attachment, by path."""

    @abstractmethod
    async def drop_attachment(self, path: str) -> list[CachedFile]:
        """Forget the attachment at ``path`` (NotFound when there is none) with its
        files' rows and chunk rows; the files it had."""

    @abstractmethod
    async def put_cached_files(self, files: Sequence[CachedFile]) -> None:
        """Record (or replace, by file id) files of attachments."""

    @abstractmethod
    async def cached_files(self, attachment: str) -> list[CachedFile]:
        """The files of one attachment, by path."""

    @abstractmethod
    async def find_cached(self, file_ids: Sequence[str]) -> dict[str, CachedFile]:
        """Those of ``file_ids`` that are files of an attachment."""

    @abstractmethod
    async def drop_cached_files(self, file_ids: Sequence[str]) -> None:
        """Forget these files' rows and their chunk rows."""

    @abstractmethod
    async def filled_chunks(self, file_id: str, indexes: Sequence[int]) -> dict[int, int]:
        """Of chunks ``indexes`` of ``file_id``, the filled ones: index -> CRC32C."""

    @abstractmethod
    async def take_fill(self, file_id: str, index: int, holder: str, *, until: float,
                        now: float) -> bool:
        """Lease the fill of a chunk to ``holder`` until ``until``: False when it is
        filled, or leased to another holder until after ``now``."""

    @abstractmethod
    async def record_fill(self, file_id: str, index: int, *, size: int, crc: int,
                          now: float) -> bool:
        """Mark the chunk filled (its lease ends); False, recording nothing, when the
        file is no longer a cached file (refreshed or detached meanwhile).
        QuotaExceeded, recording nothing, when the fill's bytes would take a quota
        above the file past its limit."""

    @abstractmethod
    async def release_fill(self, file_id: str, index: int, holder: str) -> None:
        """End ``holder``'s lease on an unfilled chunk (its fill failed)."""

    @abstractmethod
    async def touch_chunks(self, chunks: Sequence[tuple[str, int]], now: float,
                           counts: dict[str, tuple[int, int]] | None = None) -> None:
        """Mark filled chunks ``(file_id, index)`` used at ``now``, and add ``counts``
        (attachment path -> hits, misses) to the attachments' counters."""

    @abstractmethod
    async def cache_chunks(self, *, after: tuple[str, int] = ("", -1),
                           limit: int = 10000) -> list[CachedChunk]:
        """Filled chunks after ``(file_id, index)`` in that order, a page at a time."""

    @abstractmethod
    async def evict_chunks(self, chunks: Sequence[tuple[str, int]]) -> None:
        """Forget that these chunks are filled (their bytes are being deleted)."""

    @abstractmethod
    async def cache_usage(self) -> dict[str, tuple[int, int, int, int]]:
        """Per attachment path: (files, their total bytes, chunks filled, bytes filled)."""
