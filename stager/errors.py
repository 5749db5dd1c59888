"""Every error stager raises, and the one table that maps them to HTTP.

::

    StagerError
    ├── BadRequest (ValueError) ................... 400 bad_request
    │   ├── InvalidPath ........................... 400 invalid_path
    │   ├── InvalidLayout ......................... 400 invalid_layout
    │   └── ChecksumMismatch ...................... 400 checksum_mismatch
    ├── NotFound (FileNotFoundError) .............. 404 not_found
    │   ├── ChunkNotFound ......................... 404 chunk_not_found
    │   └── UploadNotFound ........................ 404 upload_not_found
    ├── MethodNotAllowed .......................... 405 method_not_allowed
    ├── AlreadyExists (FileExistsError) ........... 409 exists
    ├── IsADirectory (IsADirectoryError) .......... 409 is_a_directory
    ├── NotADirectory (NotADirectoryError) ........ 409 not_a_directory
    ├── DirectoryNotEmpty (OSError ENOTEMPTY) ..... 409 not_empty
    ├── Unauthenticated (PermissionError) ......... 401 unauthenticated
    ├── Forbidden (PermissionError) ............... 403 forbidden
    ├── ReadOnly (PermissionError) ................ 403 read_only
    ├── PayloadTooLarge (ValueError) .............. 413 too_large
    ├── RangeNotSatisfiable (ValueError) .......... 416 range_not_satisfiable
    ├── InsufficientStorage (OSError ENOSPC) ...... 507 no_space
    │   └── QuotaExceeded (OSError EDQUOT) ........ 507 quota_exceeded
    ├── SourceError (OSError EIO) ................. 502 source_error
    ├── Unavailable (ConnectionError) ............. 503 unavailable
    │   ├── NoTargets ............................. 503 no_targets
    │   └── TargetUnavailable ..................... 503 target_unavailable
    ├── CorruptChunk (OSError EIO) ................ 500 chunk_corrupt
    ├── StorageError (OSError EIO) ................ 500 io_error
    └── InternalError ............................. 500 internal

Each class also inherits the built-in it means, so callers that know nothing of
stager (``except FileNotFoundError``) keep working.  :data:`ERROR_TABLE` is used
by the server middleware one way (exception → status + code) and by the client
the other way (code → exception, :func:`error_from_wire`).  Nobody parses
message text.  Foreign exceptions of the transport (aiohttp, timeouts, socket
errors) become :class:`Unavailable` in one place too: :func:`unreachable`.
"""

from __future__ import annotations

import errno
import json
import ssl
from typing import Any

import aiohttp


class StagerError(Exception):
    """Base of every stager error.  ``details`` travel on the wire as JSON."""

    code = "internal"
    status = 500

    def __init__(self, message: str = "", **details: Any) -> None:
        self.message = message or self.__class__.__doc__ or self.code
        self.details = details
        # OSError subclasses want (errno, strerror); give them a sensible errno.
        if isinstance(self, OSError):
            OSError.__init__(self, getattr(self, "errno_value", errno.EIO), self.message)
        else:
            Exception.__init__(self, self.message)

    def __str__(self) -> str:
        return self.message

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.details:
            body["details"] = self.details
        return body


class BadRequest(StagerError, ValueError):
    """The request is malformed."""

    errno_value = errno.EINVAL


class InvalidPath(BadRequest):
    """The path is not a valid stager path."""


class InvalidLayout(BadRequest):
    """The layout parameters are invalid."""


class ChecksumMismatch(BadRequest):
    """The data does not match the checksum sent with it."""


class NotFound(StagerError, FileNotFoundError):
    """No such file or directory."""

    errno_value = errno.ENOENT


class ChunkNotFound(NotFound):
    """No such chunk on this target."""


class UploadNotFound(NotFound):
    """No such pending upload (never created, already committed or aborted)."""


class MethodNotAllowed(StagerError):
    """This method is not allowed on this route."""


class AlreadyExists(StagerError, FileExistsError):
    """The destination already exists."""

    errno_value = errno.EEXIST


class IsADirectory(StagerError, IsADirectoryError):
    """The path is a directory."""

    errno_value = errno.EISDIR


class NotADirectory(StagerError, NotADirectoryError):
    """A component of the path is not a directory."""

    errno_value = errno.ENOTDIR


class DirectoryNotEmpty(StagerError, OSError):
    """The directory is not empty."""

    errno_value = errno.ENOTEMPTY


class Unauthenticated(StagerError, PermissionError):
    """No valid credential: the token is missing, malformed, expired, forged or revoked.

    ``details["reason"]`` says which, so a client can tell an expired capability
    (fetch a new one) from a forged one; the message never repeats the token."""

    errno_value = errno.EACCES


class Forbidden(StagerError, PermissionError):
    """A valid credential that does not cover this request (its scope or its prefixes)."""

    errno_value = errno.EACCES


class ReadOnly(StagerError, PermissionError):
    """The file system or file is read-only."""

    errno_value = errno.EROFS


class PayloadTooLarge(StagerError, ValueError):
    """The request body is larger than the server accepts."""


class RangeNotSatisfiable(StagerError, ValueError):
    """The requested byte range cannot be served."""


class InsufficientStorage(StagerError, OSError):
    """The storage target is full."""

    errno_value = errno.ENOSPC


class QuotaExceeded(InsufficientStorage):
    """A write would take a directory past its quota (``stager quota set``); the
    details name the ``directory``, the ``limit``, its ``use`` and which
    ``resource`` (``bytes`` or ``files``)."""

    errno_value = errno.EDQUOT


class SourceError(StagerError, OSError):
    """A staging source (any fsspec URL) could not be listed or read."""

    errno_value = errno.EIO


class Unavailable(StagerError, ConnectionError):
    """A server needed for this request cannot be reached."""

    errno_value = errno.EIO


class NoTargets(Unavailable):
    """Not enough healthy storage targets for this layout."""


class TargetUnavailable(Unavailable):
    """A storage target cannot be reached."""


class CorruptChunk(StagerError, OSError):
    """A stored chunk failed its checksum."""

    errno_value = errno.EIO


class StorageError(StagerError, OSError):
    """The storage device reported an I/O error."""

    errno_value = errno.EIO


class InternalError(StagerError):
    """An unexpected server error."""


# (class, HTTP status, wire code).  Order matters only for readability.
ERROR_TABLE: tuple[tuple[type[StagerError], int, str], ...] = (
    (BadRequest, 400, "bad_request"),
    (InvalidPath, 400, "invalid_path"),
    (InvalidLayout, 400, "invalid_layout"),
    (ChecksumMismatch, 400, "checksum_mismatch"),
    (Unauthenticated, 401, "unauthenticated"),
    (Forbidden, 403, "forbidden"),        # first of 403: an unknown 403 code is a Forbidden
    (ReadOnly, 403, "read_only"),
    (NotFound, 404, "not_found"),
    (ChunkNotFound, 404, "chunk_not_found"),
    (UploadNotFound, 404, "upload_not_found"),
    (MethodNotAllowed, 405, "method_not_allowed"),
    (AlreadyExists, 409, "exists"),
    (IsADirectory, 409, "is_a_directory"),
    (NotADirectory, 409, "not_a_directory"),
    (DirectoryNotEmpty, 409, "not_empty"),
    (PayloadTooLarge, 413, "too_large"),
    (RangeNotSatisfiable, 416, "range_not_satisfiable"),
    (InternalError, 500, "internal"),
    (CorruptChunk, 500, "chunk_corrupt"),
    (StorageError, 500, "io_error"),
    (SourceError, 502, "source_error"),
    (Unavailable, 503, "unavailable"),
    (NoTargets, 503, "no_targets"),
    (TargetUnavailable, 503, "target_unavailable"),
    (InsufficientStorage, 507, "no_space"),     # first of 507
    (QuotaExceeded, 507, "quota_exceeded"),
)

for _cls, _status, _code in ERROR_TABLE:
    _cls.status = _status
    _cls.code = _code

_BY_CODE: dict[str, type[StagerError]] = {code: cls for cls, _, code in ERROR_TABLE}
_BY_STATUS: dict[int, type[StagerError]] = {}
for _cls, _status, _code in ERROR_TABLE:
    _BY_STATUS.setdefault(_status, _cls)


def error_from_wire(status: int, body: Any) -> StagerError:
    """Rebuild the exception a server sent as ``{"error": CODE, "message": ...}``.

    ``body`` is the JSON value, or the raw bytes of the response body.  A body
    that is not JSON (a proxy's error page) names no code: a 4xx is then a
    :class:`BadRequest`, a 5xx the table's class for its status."""
    if isinstance(body, bytes | bytearray | memoryview):
        body = _json_or_none(bytes(body))
    if body is None and status < 500:
        return BadRequest(f"HTTP {status}")
    code = body.get("error") if isinstance(body, dict) else None
    message = body.get("message", "") if isinstance(body, dict) else ""
    details = body.get("details", {}) if isinstance(body, dict) else {}
    cls = _BY_CODE.get(code or "") or _BY_STATUS.get(status)
    if cls is None:
        cls = BadRequest if 400 <= status < 500 else InternalError
    err = cls(message or f"HTTP {status}", **(details if isinstance(details, dict) else {}))
    return err


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


# What the transport raises when the other end cannot be reached, answers
# nothing in time, or hangs up mid-answer.
TRANSPORT_FAILURES: tuple[type[BaseException], ...] = (TimeoutError, OSError,
                                                       aiohttp.ClientError)


def unreachable(exc: BaseException, what: str, **details: Any) -> Unavailable:
    """The stager error for a transport failure ``exc`` talking to ``what``
    (``"metadata server URL unreachable"``): :class:`TargetUnavailable` when
    ``details`` name a ``target``, else :class:`Unavailable`."""
    cls = TargetUnavailable if "target" in details else Unavailable
    cert = _certificate_failure(exc)
    if cert is not None:    # no traceback-shaped text: what failed and what to do
        reason = getattr(cert, "verify_message", "") or str(cert)
        return cls(f"{what}: TLS certificate not trusted ({reason}); "
                   f"give the cluster's CA with --ca FILE or STAGER_CA_FILE", **details)
    hint = ""
    if isinstance(exc, aiohttp.ServerDisconnectedError) and \
            str(details.get("url", "")).startswith("http://"):
        hint = " (if it serves https, use an https:// URL)"
    return cls(f"{what}: {type(exc).__name__}: {exc}{hint}", **details)


def _certificate_failure(exc: object) -> ssl.SSLCertVerificationError | None:
    """The certificate check that failed under ``exc`` (aiohttp and urllib wrap it)."""
    for _ in range(5):
        inner = getattr(exc, "certificate_error", None)    # aiohttp's wrapper (itself
        if inner is not None:                               # a CertificateError)
            exc = inner
        if isinstance(exc, ssl.SSLCertVerificationError):
            return exc
        if not isinstance(exc, BaseException):
            return None
        exc = getattr(exc, "reason", None) or exc.__cause__     # urllib's URLError
    return None


def errno_of(exc: BaseException) -> int:
    """The errno a POSIX caller (the FUSE mount) should see for ``exc``."""
    if isinstance(exc, OSError) and exc.errno:
        return int(exc.errno)
    if isinstance(exc, StagerError):
        return int(getattr(exc, "errno_value", errno.EIO))
    return errno.EIO
