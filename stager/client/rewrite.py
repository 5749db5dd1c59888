"""When a failed write is written again, whole, as a new upload: the one policy.

A writer that can produce its bytes again (``pipe``'s bytes in memory, ``put``
and ``stage`` of a source read by path, each file of ``write_many``) does not let
a write fail for a reason that a fresh upload would not meet: a server that was
unreachable (the chunk re-copy after a reroute found no surviving replica up, the
metadata server did not answer), or an upload collected before any commit of it
was done (``never_committed``; lost in a crash of the metadata database).  A new
upload's layout is picked from the targets up by then.

It is never done where a try may have been committed (``settled``: a commit was
asked again and its first answer was lost), nor without ``overwrite``: only an
overwrite makes writing again idempotent.  ``NoTargets`` stands: no set of up
targets can give the layout asked for, and waiting would not change that soon.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..errors import NoTargets, Unavailable, UploadNotFound

T = TypeVar("T")


def worth_writing_again(exc: BaseException) -> bool:
    """Whether a write that failed with ``exc`` may be written again, whole."""
    if isinstance(exc, UploadNotFound):
        return not exc.details.get("settled")
    return isinstance(exc, Unavailable) and not isinstance(exc, NoTargets)


def backoff(attempt: int) -> float:
    """Seconds to wait before writing again for the ``attempt``-th time (1, 2, …)."""
    return min(0.25 * 2 ** (attempt - 1), 4.0)


async def written_again(write: Callable[[], Awaitable[T]], retries: int) -> T:
    """``write()``; again, after :func:`backoff`, up to ``retries`` more times while
    it fails with an error :func:`worth_writing_again`."""
    for attempt in range(retries + 1):
        if attempt:
            await asyncio.sleep(backoff(attempt))
        try:
            return await write()
        except (Unavailable, UploadNotFound) as exc:
            if attempt == retries or not worth_writing_again(exc):
                raise
    raise AssertionError("unreachable")
