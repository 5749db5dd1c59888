"""The idempotency key of the request being served, for the operations that use it.

The metadata server records the answer to a keyed request right after the
operation (stager/web/idempotency.py), not in its transaction; a server that dies
between the two acted without recording.  A client then sends the request again,
marked as a retry, to another server.  For writes that second try finds what the
first did instead of acting again:

- a create's file id is derived from the key and the path, so the retry looks for
  that upload and answers it (one upload, never two);
- a commit whose upload is gone looks for the committed file with that id and
  answers it (never a 404 for a file that was committed); when that file is not
  there either, the store says whether the id was retired (a file removed or
  replaced, or an upload abandoned, in the last ``KEY_TTL``).  An id never retired
  was never committed: its upload was lost in a crash of the metadata database
  before any try committed it (a pending upload's commit does not wait for the
  flush), and the 404 says so (``never_committed``), so that the writer, which may
  hold the bytes, sends them again.

Only retries pay the look-up.  The key is bound by the middleware, in the task
that runs the handler (a :class:`~contextvars.ContextVar`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass

from ..errors import NotFound, UploadNotFound
from .store.base import MetaStore, NodeEntry, Upload


@dataclass(frozen=True)
class OperationKey:
    key: str            # as recorded: scoped to the token, method and path
    retried: bool       # the client sent it before: the first try may have acted


# the routes whose retries find an earlier try's work (no recorded answer needed):
# a gateway PUT is a create and a commit (its retry asks earlier_commit, as a commit's)
SELF_ANSWERING = frozenset({"create", "commit", "gateway_put"})
_CURRENT: ContextVar[OperationKey | None] = ContextVar("stager_operation_key", default=None)


def bind(key: str, retried: bool) -> None:
    """Bind the key of the request this task serves (the middleware's callback)."""
    _CURRENT.set(OperationKey(key, retried))


def keyed() -> bool:
    """Does the request being served carry a key (its client may send it again)?"""
    return _CURRENT.get() is not None


def retried() -> bool:
    current = _CURRENT.get()
    return current is not None and current.retried


def new_file_id(path: str) -> str:
    """A new file's id: random, or derived from the request's key and ``path`` when it
    has one, so that every try of one create names the same upload."""
    current = _CURRENT.get()
    if current is None:
        return uuid.uuid4().hex
    return uuid.uuid5(uuid.NAMESPACE_URL, f"{current.key}\0{path}").hex


async def earlier_uploads(store: MetaStore, file_ids: Sequence[str]) -> dict[str, Upload]:
    """On a retry: the uploads among ``file_ids`` an earlier try already began."""
    if not retried() or not file_ids:
        return {}
    found = await store.get_uploads(file_ids)
    return {u.file_id: u for u in found if isinstance(u, Upload)}


async def earlier_commit(store: MetaStore, file_id: str) -> NodeEntry | None:
    """On a retry: the committed file ``file_id``, when an earlier try committed it."""
    if not retried():
        return None
    path = await store.path_of_file(file_id)
    if path is None:
        return None
    try:
        entry = await store.stat(path)
    except NotFound:
        return None
    return entry if entry.file_id == file_id else None


async def after_gone(store: MetaStore, file_id: str, gone: UploadNotFound) -> NodeEntry:
    """A commit found its upload ``file_id`` gone: the file an earlier try committed
    (:func:`earlier_commit`), or ``gone`` raised, marked ``never_committed`` where no
    try committed it -- always on a first try; on a retry when the id was never
    retired (a commit followed by a remove or a replace would have retired it)."""
    done = await earlier_commit(store, file_id)
    if done is not None:
        return done
    if not retried() or not await store.retired(file_id):
        raise UploadNotFound(gone.message, **gone.details, never_committed=True) from None
    raise gone
