"""HTTP ``Range`` parsing for single byte ranges (RFC 9110 §14)."""

from __future__ import annotations

import re

from ..errors import RangeNotSatisfiable

_UNIT = re.compile(r"^bytes\s*=", re.IGNORECASE)
_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$",
                    re.IGNORECASE | re.ASCII)     # \d: not the digits of other scripts


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """Return ``(start, stop)`` (stop exclusive) or ``None`` for "the whole thing".

    * no header, another unit, or several ranges → ``None`` (RFC 9110 lets a
      server ignore those and answer 200 with the whole representation);
    * a malformed or unsatisfiable ``bytes=`` range → :class:`RangeNotSatisfiable`
      (the caller answers 416 with ``Content-Range: bytes */size``).
    """
    if header is None:
        return None
    text = header.strip()
    if not _UNIT.match(text):   # another unit ("items=", "bytesx=") is not ours to parse
        return None
    if "," in text:
        return None
    m = _RANGE.match(text)
    if not m or (not m.group(1) and not m.group(2)):
        raise RangeNotSatisfiable(f"malformed range {header!r}", size=size)
    first, last = m.group(1), m.group(2)
    if not first:  # suffix range: the last N bytes
        n = int(last)
        if n == 0 or size == 0:
            raise RangeNotSatisfiable(f"range {header!r} not satisfiable", size=size)
        return max(0, size - n), size
    start = int(first)
    stop = size if not last else int(last) + 1
    if last and int(last) < start:
        raise RangeNotSatisfiable(f"malformed range {header!r}", size=size)
    if start >= size:
        raise RangeNotSatisfiable(f"range {header!r} not satisfiable", size=size)
    return start, min(stop, size)


def content_range(start: int, stop: int, size: int) -> str:
    return f"bytes {start}-{stop - 1}/{size}"


def unsatisfied_range(size: int) -> str:
    return f"bytes */{size}"


def parse_content_range(value: str) -> tuple[int | None, int | None, int | None]:
    """``(first, last, total)`` of a ``Content-Range: bytes first-last/total`` value
    (what :func:`content_range` writes); ``None`` for what it lacks (``total`` is
    ``*`` when the server does not know)."""
    unit, _, spec = value.partition(" ")
    span, _, total = spec.partition("/")
    first, _, last = span.partition("-")
    if unit != "bytes" or not (first.isdigit() and last.isdigit()):
        return None, None, None
    return int(first), int(last), int(total) if total.isdigit() else None
