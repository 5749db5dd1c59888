"""What a read does when the stat it was planned from went stale: the one policy.

A read by path takes the path's stat (from the stat cache, for up to
``stat_cache_ttl`` seconds, or fresh) and reads that file's chunks.  Meanwhile
another client may have removed the file or written another version at the path
(a new file id); once the metadata server's upkeep has collected the old chunks,
every replica answers "no such chunk", which the read engine reports as
:class:`~stager.errors.TargetUnavailable` (a cached file refreshed at its source:
its fill answers :class:`~stager.errors.NotFound` for the old id).  That is not
the reader's failure:

* a read by path (:func:`read_current`: ``cat``, ``read_into``, fsspec's
  ``cat_file`` and ``cat_ranges``) stats the path again, uncached, and when it
  now names another file (another id), reads that one, whole, once; when it
  names nothing, :class:`~stager.errors.NotFound`.  The same file: the error
  was a real one, and stands.
* a file held open (:func:`gone_while_open`) keeps reading its own version; once
  that version is gone it fails with :class:`~stager.errors.NotFound` ("open it
  again"), never reading another version's bytes into it.

Before the collection the old chunks are still there, and a read through a
cached stat returns the old version, whole: the documented stat cache TTL
(docs/client.md, "The stat cache").  ``open`` always stats afresh.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from ..dataplane import StripedReader
from ..errors import NotFound, StagerError, TargetUnavailable
from ..protocol import paths
from ..protocol.models import FileInfo

if TYPE_CHECKING:
    from .async_client import AsyncClient

T = TypeVar("T")


def same_version(a: FileInfo, b: FileInfo) -> bool:
    """Whether two stats name the same committed file (its id changes with every
    version: an overwrite, a rename onto the path, a refreshed cached file)."""
    return a.file_id == b.file_id and a.is_dir == b.is_dir


async def current_or_none(client: AsyncClient, info: FileInfo) -> FileInfo | None:
    """The path's stat now, uncached, when it names another file than ``info``
    (raises :class:`NotFound` when it names nothing); ``None`` when it is the same."""
    fresh = await client.stat(info.path, cached=False)
    return None if same_version(fresh, info) else fresh


async def read_current(client: AsyncClient, path: str,
                       read: Callable[[StripedReader], Awaitable[T]]) -> T:
    """``read(reader)`` of the file ``path`` names (its stat cached or not); when that
    read finds the file's chunks gone, ``read`` again, once, of the file the path
    names now.

    Through a cached stat the first read makes one round over the replicas, without
    the pauses between rounds (``retries``: 0.7 s in all by default) that a missing
    chunk would otherwise wait out before the stat is taken again; when the path
    still names the same file, the read is made again with every retry (and the
    targets' URLs that stat gives), so a target that is down is waited for as long as
    through a fresh stat."""
    path = paths.normalize(path)
    hit = client.meta.cached_stat(path)
    info = hit or await client.stat(path, cached=False)
    try:
        return await read(client.reader(info, retries=0 if hit is not None else None))
    except (TargetUnavailable, NotFound):
        fresh = await client.stat(path, cached=False)   # NotFound: the path names nothing
        if hit is None and same_version(fresh, info):
            raise
    return await read(client.reader(fresh))     # the same file: its targets' URLs now


async def gone_while_open(client: AsyncClient, info: FileInfo,
                          error: StagerError) -> StagerError:
    """The error a read of the open file ``info`` that failed with ``error`` raises:
    :class:`NotFound` when the path names another file now, or none (its version is
    gone for good); ``error`` itself when the file is still the path's."""
    try:
        if await current_or_none(client, info) is None:
            return error
    except NotFound:
        pass
    except StagerError:         # the metadata server could not say: the read's error
        return error
    return NotFound(f"{info.path} was replaced or removed while open (its version "
                    f"{info.file_id} is gone): open it again", path=info.path,
                    file_id=info.file_id)
