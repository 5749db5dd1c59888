"""Parsing request pieces into checked values; every failure is a 4xx, never a 500."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ..errors import BadRequest, InvalidPath, PayloadTooLarge
from ..protocol import paths


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
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def path_arg(request: web.Request) -> str:
    """The namespace path from the URL (already percent-decoded), checked.

    An encoded slash (``%2F``) is refused: decoded it would silently become a
    separator, so ``a%2Fb`` and ``a/b`` would name the same file.
    """
    if "%2f" in request.rel_url.raw_path.lower():
        raise InvalidPath("an encoded slash (%2F) is not allowed in a path",
                          path=request.rel_url.raw_path)
    return paths.normalize("/" + request.match_info.get("path", ""))


def query_int(request: web.Request, name: str, default: int | None = None) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name} must be an integer") from None


def query_bool(request: web.Request, name: str, default: bool = False) -> bool:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise BadRequest(f"query parameter {name} must be true or false")
