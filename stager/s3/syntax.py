"""The syntax of a request's numbers and header-bound values, checked once at the door.

Each handler reads the parameters it uses, and a few kinds of value are easy to
read wrongly there, with a 500 as the price: ``str.isdigit`` is true of ``"²"``
(which ``int`` refuses) and of ``"١"`` (which ``int`` reads as 1), and aiohttp
refuses to send a header whose value holds a control character, so a
``response-content-type`` echoed into the answer raised mid-handler.  So
:func:`check` refuses them before any handler runs, with S3's answers:

- the integer query parameters (``partNumber``, ``max-keys``, …) and the integer
  header ``x-amz-decoded-content-length``: ASCII digits only (``InvalidArgument``;
  each handler still checks the range it allows);
- ``list-type``: ``2`` or absent (ListObjects v1 has none);
- ``x-amz-content-sha256``: a SHA-256 in hex or one of S3's named payload kinds;
- ``x-amz-checksum-algorithm`` / ``x-amz-sdk-checksum-algorithm``: an algorithm the
  gateway computes (``InvalidRequest``);
- ``response-*`` overrides: a value a header can carry;
- ``x-amz-copy-source-range``: ASCII (its digits are read with ``isdigit``).
"""

from __future__ import annotations

import re

from aiohttp import web

from .errors import S3Error
from .payload import ALGORITHMS

INTEGER_QUERY = ("partNumber", "max-keys", "max-parts", "max-uploads",
                 "part-number-marker", "list-type")
INTEGER_HEADERS = ("x-amz-decoded-content-length",)
MAX_DIGITS = 20             # above any count or size; int() of more is needless work
PAYLOAD_KINDS = frozenset({
    "UNSIGNED-PAYLOAD", "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
    "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD",
    "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD-TRAILER"})
_DIGITS = re.compile(r"[0-9]+")
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_NOT_HEADER = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")     # a tab is allowed


def _integer(name: str, text: str) -> None:
    if not _DIGITS.fullmatch(text) or len(text) > MAX_DIGITS:
        raise S3Error("InvalidArgument", f"{name} must be a non-negative integer, "
                      f"not {text[:40]!r}")


def check(request: web.Request) -> None:
    """Refuse ``request`` when a value above is malformed; see the module's text."""
    query, headers = request.query, request.headers
    for name in INTEGER_QUERY:
        for text in query.getall(name, ()):
            _integer(name, text)
    if query.get("list-type", "2") != "2":
        raise S3Error("InvalidArgument", "Invalid List Type specified: list-type is 2")
    for name in INTEGER_HEADERS:
        if name in headers:
            _integer(name, headers[name])
    sha = headers.get("x-amz-content-sha256")
    if sha is not None and sha not in PAYLOAD_KINDS and not _SHA256.fullmatch(sha):
        raise S3Error("InvalidArgument", "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, "
                      "a STREAMING-… kind, or a SHA-256 in hex")
    for name in ("x-amz-checksum-algorithm", "x-amz-sdk-checksum-algorithm"):
        if name in headers and headers[name].lower() not in ALGORITHMS:
            raise S3Error("InvalidRequest", f"Value for {name} header is invalid: "
                          f"{headers[name][:40]!r}")
    if not headers.get("x-amz-copy-source-range", "").isascii():
        raise S3Error("InvalidArgument", "x-amz-copy-source-range is bytes=FIRST-LAST")
    for name, text in query.items():
        if name.startswith("response-") and _NOT_HEADER.search(text):
            raise S3Error("InvalidArgument", f"{name} holds a control character")
