"""Parsing request pieces into checked values; every failure is a 4xx, never a 500."""

from __future__ import annotations

import asyncio
import json
import re
from collections import deque
from typing import Any

from aiohttp import hdrs, web

from ..errors import BadRequest, InvalidPath, PayloadTooLarge
from ..protocol import paths
from ..protocol.models import INT64_MAX

PARSE_AWAY = 1 << 20      # JSON bodies larger than this are parsed in a thread


async def read_json(request: web.Request, max_size: int) -> dict[str, Any]:
    """The body as a JSON object, or BadRequest / PayloadTooLarge."""
    if request.content_length is not None and request.content_length > max_size:
        raise PayloadTooLarge(f"JSON body over {max_size} bytes", limit=max_size)
    # read(n) returns what has arrived, up to n bytes: loop until the end of the body.
    parts: list[bytes] = []
    size = 0
    while data := await request.content.read(max_size + 1 - size):
        parts.append(data)
        size += len(data)
        if size > max_size:
            raise PayloadTooLarge(f"JSON body over {max_size} bytes", limit=max_size)
    raw = b"".join(parts)
    # A large body (a manifest of thousands of files) takes a good part of a
    # second to parse, and its objects a garbage collection: off the loop.
    body = await asyncio.to_thread(parse_json, raw) if len(raw) > PARSE_AWAY \
        else parse_json(raw or b"{}")
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse_json(raw: bytes) -> Any:
    """Strict JSON, or BadRequest: no ``NaN`` or ``Infinity`` (Python's extensions, which
    the servers would echo back as invalid JSON), and no lone surrogate in a string
    (``"\\ud800"``: text that SQLite cannot store; it was a 500)."""
    try:
        body = json.loads(raw, parse_constant=_no_constant)
        if _SURROGATE_ESCAPE.search(raw):       # rare: only then walk the whole body
            _check_text(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("malformed JSON: nested too deeply") from None
    return body


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _check_text(value: Any) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest("a string of the body is not valid Unicode (a lone surrogate)") \
                from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key)
            _check_text(item)
    elif isinstance(value, list):
        for item in value:
            _check_text(item)


class BodyBuffers:
    """Body buffers kept for reuse, ``keep_bytes`` at most (the oldest go first):
    a fresh buffer costs a page fault and zeroing per page, more than the copy
    into it.  Give a buffer back only once nothing uses it any more."""

    def __init__(self, keep_bytes: int) -> None:
        self.keep_bytes = keep_bytes
        self._free: deque[bytearray] = deque()
        self._kept = 0

    def take(self, size: int) -> bytearray:
        for buf in self._free:
            if len(buf) == size:
                self._free.remove(buf)
                self._kept -= size
                return buf
        return bytearray(size)

    def give(self, buf: bytearray) -> None:
        if len(buf) > self.keep_bytes:
            return
        self._free.append(buf)
        self._kept += len(buf)
        while self._kept > self.keep_bytes:
            self._kept -= len(self._free.popleft())


async def read_body(request: web.Request, max_size: int,
                    buffers: BodyBuffers | None = None) -> bytearray:
    """The whole body, in one buffer of the request's ``Content-Length`` (taken from
    ``buffers`` when given).

    ``request.read()`` joins the received pieces into a growing buffer, then
    copies the whole once more into ``bytes``; at chunk sizes those copies (and
    the fresh pages they touch) were a large share of a data server's CPU.  Here
    each piece is copied once, into its place.  A body without a length (chunked
    encoding) is read the ordinary way.
    """
    length = request.content_length
    if length is not None and length > max_size:
        raise PayloadTooLarge(f"body over the limit of {max_size} bytes", limit=max_size)
    if length is None or request.headers.get(hdrs.TRANSFER_ENCODING):
        return bytearray(await request.read())
    body = buffers.take(length) if buffers is not None else bytearray(length)
    view = memoryview(body)
    pos = 0
    while True:
        piece, _ = await request.content.readchunk()    # one received piece, never joined
        if not piece:
            break
        end = pos + len(piece)
        if end > length:
            raise BadRequest(f"the body is longer than its Content-Length {length}")
        view[pos:end] = piece
        pos = end
    if pos != length:
        raise BadRequest(f"the body has {pos} of its {length} bytes (Content-Length)")
    return body


def path_arg(request: web.Request) -> str:
    """The namespace path from the URL (already percent-decoded), checked.

    An encoded slash (``%2F``) is refused: decoded it would silently become a
    separator, so ``a%2Fb`` and ``a/b`` would name the same file.
    """
    raw = request.rel_url.raw_path
    if "%" in raw and "%2f" in raw.lower():      # lower() only where a % may be one
        raise InvalidPath("an encoded slash (%2F) is not allowed in a path", path=raw)
    return paths.normalize("/" + request.match_info.get("path", ""))


def query_int(request: web.Request, name: str, default: int | None = None) -> int | None:
    """A count from the query: a whole number from 0 to :data:`INT64_MAX` (it may reach
    SQLite, whose INTEGER is 64-bit)."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name} must be an integer") from None
    if not 0 <= value <= INT64_MAX:
        raise BadRequest(f"query parameter {name} must be from 0 to {INT64_MAX}")
    return value


def query_bool(request: web.Request, name: str, default: bool = False) -> bool:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise BadRequest(f"query parameter {name} must be true or false")
