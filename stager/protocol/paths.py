"""Namespace paths: one canonical form, and the checks that keep traversal out.

A stager path is absolute, ``/`` separated, with no empty, ``.`` or ``..``
segments and no NUL.  ``normalize("a/b/")`` is ``"/a/b"``; the root is ``"/"``.
Percent-encoding is decoded by the HTTP layer before these checks run, so
``%2e%2e`` is caught as ``..``.
"""

from __future__ import annotations

import functools

from ..errors import InvalidPath

MAX_PATH = 4096
MAX_NAME = 255


def normalize(path: str) -> str:
    """Return the canonical form of ``path`` or raise :class:`InvalidPath`."""
    if type(path) is str:
        return _normalized(path)
    if not isinstance(path, str):
        raise InvalidPath(f"path must be a string, not {type(path).__name__}")
    return _normalize(str(path))


@functools.lru_cache(maxsize=4096)
def _normalized(path: str) -> str:
    """One stat normalizes its path four times on its way (the route, the service, the
    store, its walk): the answers are kept, a raised InvalidPath never is."""
    return _normalize(path)


def _normalize(path: str) -> str:
    if "\x00" in path:
        raise InvalidPath("path contains NUL", path=path.replace("\x00", "\\0"))
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:       # a lone surrogate ("\ud800" in JSON): SQLite cannot store it
        raise InvalidPath("path is not valid Unicode (a lone surrogate)") from None
    if len(encoded) > MAX_PATH:
        raise InvalidPath("path too long", length=len(path))
    body = path[1:] if path.startswith("/") else path
    if body.endswith("/") and body != "/":     # one trailing slash is fine; "//" is not
        body = body[:-1]
    if not body:
        return "/"
    parts = body.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise InvalidPath(f"invalid path segment {part!r} in {path!r}", path=path)
        if len(part.encode("utf-8")) > MAX_NAME:
            raise InvalidPath("path segment too long", path=path)
        if any(ord(c) < 0x20 for c in part):
            raise InvalidPath("path contains a control character", path=path)
    return "/" + "/".join(parts)


def split(path: str) -> tuple[str, str]:
    """``"/a/b/c"`` → ``("/a/b", "c")``; the root has no parent."""
    path = normalize(path)
    if path == "/":
        raise InvalidPath("the root has no parent")
    parent, _, name = path.rpartition("/")
    return parent or "/", name


def parts(path: str) -> list[str]:
    path = normalize(path)
    return [] if path == "/" else path[1:].split("/")


def join(parent: str, name: str) -> str:
    return normalize(parent.rstrip("/") + "/" + name)


def is_within(path: str, ancestor: str) -> bool:
    """True when ``path`` is ``ancestor`` or below it."""
    return ancestor == "/" or path == ancestor or path.startswith(ancestor + "/")
