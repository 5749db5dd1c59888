"""Who may do what: pure functions of the verified claims and the request.

Decisions, and why:

- **Scopes.** ``read`` reads and lists; ``write`` creates, writes, renames and
  removes; the two are independent (a drop-box token may write without reading;
  give both for the usual case).  ``admin`` implies every other scope — ``read``,
  ``write`` and ``join`` — since an admin can mint any token anyway, refusing it
  a scope would add no safety.  ``join`` grants nothing but itself: a data
  server registering a new target.  ``target`` is a target credential's only
  scope: the metadata server mints one per target at its first registration, and it
  heartbeats, leaves, reports scrub findings and registers again for that one
  target (:func:`acts_for`), nothing else.  ``telemetry`` lets a Loader report
  its job for a dataset under the prefixes; ``write`` (and ``admin``) imply it, so
  a Loader's usual token reports, and a read-only one needs it named.
  ``s3gateway`` is an S3 gateway's own credential: it asks the metadata server whether
  an S3 signature is good (stager/s3/auth.py) and nothing else — it reads, writes and
  lists nothing; the gateway acts with the token of each request's key.
- **Prefixes.** A path is covered when it is a prefix or below one, at segment
  boundaries: ``/data/a`` covers ``/data/a`` and ``/data/a/x``, never
  ``/data/ab``; ``/`` covers everything.  Operations on no path (targets,
  rebuilds, tokens, joining) are cluster-wide: they pass ``path=None`` and need a
  token that covers ``/``, so an admin of one prefix administers files there
  and nothing of the cluster.
- **Listings.** A directory shows, and its entries are shown, when
  :func:`visible`: covered, or an ancestor of a covered prefix — so a token for
  ``/datasets/imagenet`` can walk down from ``/`` to it, and sees nothing beside it.
- **Capabilities.** An operation needs a capability for that file: a ``read``
  one reads, a ``write`` one writes and reads back (a writer that routes around a
  dead target copies the chunks it already stored from a surviving replica; the
  file id is fresh for every write, so it holds nothing but what this writer
  wrote).  A read capability never writes.  The metadata server's own
  capabilities name every file but one target: a data server takes them only when
  that target is its own (so one sent to a rogue target is worth nothing anywhere
  else), and only the ``cluster`` one opens the maintenance routes (purge, scrub,
  listings, deletes).

:func:`allows` and :func:`capability_allows` answer yes or no; :func:`require`
and :func:`require_capability` raise :class:`~stager.errors.Forbidden`, for handlers.
"""

from __future__ import annotations

from ..errors import Forbidden
from ..protocol.paths import is_within
from .tokens import CLUSTER, Capability, Token

IMPLIED: dict[str, frozenset[str]] = {
    "read": frozenset({"read"}),
    "write": frozenset({"write", "telemetry"}),
    "join": frozenset({"join"}),
    "telemetry": frozenset({"telemetry"}),
    "target": frozenset({"target"}),
    "s3gateway": frozenset({"s3gateway"}),
    "admin": frozenset({"admin", "read", "write", "join", "target", "telemetry", "s3gateway"}),
}


def granted(token: Token) -> frozenset[str]:
    """Every scope ``token`` holds, implied ones included."""
    return frozenset().union(*(IMPLIED[s] for s in token.scopes))


def covers(token: Token, path: str | None) -> bool:
    """True when ``path`` (normalized) is under one of the token's prefixes;
    ``None`` (a cluster-wide operation) only for a token that covers ``/``."""
    if path is None:
        return "/" in token.prefixes
    return any(is_within(path, prefix) for prefix in token.prefixes)


def allows(token: Token, scope: str, path: str | None) -> bool:
    """May ``token`` use ``scope`` on ``path`` (normalized; ``None``: cluster-wide)?"""
    return scope in granted(token) and covers(token, path)


def visible(token: Token, path: str) -> bool:
    """Does a listing show ``path`` (normalized) to ``token``?  Needs ``read``."""
    if "read" not in granted(token):
        return False
    return any(is_within(path, prefix) or is_within(prefix, path)
               for prefix in token.prefixes)


def require(token: Token, scope: str, path: str | None) -> None:
    """:func:`allows`, or :class:`~stager.errors.Forbidden` naming what is missing."""
    if scope not in granted(token):
        raise Forbidden(f"token {token.name!r} lacks the {scope!r} scope",
                        token=token.id, scope=scope)
    if not covers(token, path):
        where = "the whole cluster" if path is None else path
        raise Forbidden(f"token {token.name!r} does not cover {where}",
                        token=token.id, path=where)


CAP_GRANTS: dict[str, frozenset[str]] = {
    "read": frozenset({"read"}),
    "write": frozenset({"write", "read"}),
    CLUSTER: frozenset({"read", "write", CLUSTER}),
}


SERVER_SCOPES = frozenset({"join", "target"})
MACHINE_SCOPES = SERVER_SCOPES | {"s3gateway"}


def is_server_credential(token: Token) -> bool:
    """A data server's join token or target credential, or an S3 gateway's credential:
    it does its one job (joining, speaking for its target, checking S3 signatures) and
    nothing a user token does, not even read the status."""
    return granted(token) <= MACHINE_SCOPES


def acts_for(token: Token, target_id: str) -> bool:
    """May ``token`` speak for the target ``target_id`` (heartbeat, leave, report)?
    Its own target credential, or an admin token."""
    if "admin" in token.scopes:
        return covers(token, None)
    return token.target == target_id


def capability_allows(cap: Capability, file_id: str | None, op: str,
                      here: str | None = None) -> bool:
    """Does ``cap`` let its holder do ``op`` ("read", "write" or "cluster") on chunks
    of ``file_id`` (``None``: a maintenance route, no one file) on the target
    ``here``?"""
    if op not in CAP_GRANTS[cap.op]:
        return False
    if cap.target is not None:                  # a server capability: its target only
        return cap.target == here
    return cap.grants(file_id)


def require_capability(cap: Capability, file_id: str | None, op: str,
                       here: str | None = None) -> None:
    """:func:`capability_allows`, or :class:`~stager.errors.Forbidden`."""
    if op not in CAP_GRANTS[cap.op]:
        raise Forbidden(f"a {cap.op} capability does not allow {op}", file=file_id, op=op)
    if cap.target is not None and cap.target != here:
        raise Forbidden("the capability is for another target", target=here)
    if cap.target is None and not cap.grants(file_id):
        raise Forbidden("the capability is for another file", file=file_id)
