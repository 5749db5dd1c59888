"""A directory page written as the server sends it, in one encode (issue 30).

``Listing.to_json`` builds a dict per entry from a :class:`~.models.FileInfo`, which
the server had built from the store's entry: three objects per row, most of a
1,000-entry page's server time.  :class:`ListedEntry` declares the same
JSON object (``FileInfo.to_json``'s fields, in its order, each left out where it
does) as a ``msgspec.Struct``: the server makes one per row, straight from the
store's row, and msgspec writes the page in one call.  Each distinct layout and
its targets' URLs, shared by the files written together, are encoded once per page
and handed as ``msgspec.Raw``.  What msgspec refuses (a lone surrogate in a name)
goes through ``json`` as before (:func:`listing_body`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import msgspec

from .models import Layout, LayoutSpec


class ListedEntry(msgspec.Struct, omit_defaults=True):
    """One entry of a page: the object ``FileInfo.to_json`` writes.  ``size`` and
    ``mtime`` have no default, so they are always written, as there; the others are
    left out at their default (None, or an empty ``attrs``), as there."""

    path: str
    type: str
    size: int
    mtime: float
    file_id: str | None = None
    layout: msgspec.Raw | None = None
    default_layout: dict[str, Any] | None = None
    checksums: list[str] | None = None
    locations: msgspec.Raw | None = None
    capability: str | None = None
    attrs: dict[str, Any] = {}

    def to_json(self) -> dict[str, Any]:
        """The same object as plain JSON (for ``json``, which cannot write Raw)."""
        out = msgspec.structs.asdict(self)
        for key in ("layout", "locations"):
            if out[key] is not None:
                out[key] = json.loads(bytes(out[key]))
        return {k: v for k, v in out.items()
                if k in ("size", "mtime") or v != ({} if k == "attrs" else None)}


class _Named(msgspec.Struct):
    path: str
    type: str


class _Page(msgspec.Struct):
    path: str
    entries: Sequence[ListedEntry] | Sequence[_Named]
    next: str | None


_encode = msgspec.json.Encoder().encode


def raw(obj: Any) -> msgspec.Raw:
    """``obj`` encoded once, to be written as it is inside each entry that holds it."""
    return msgspec.Raw(_encode(obj))


def layout_parts(layout: Layout, locations: dict[str, str]) -> tuple[msgspec.Raw,
                                                                     msgspec.Raw | None]:
    """A layout's and its locations' JSON, for every entry of a page that has them."""
    return raw(layout.to_json()), raw(locations) if locations else None


def spec_json(spec: LayoutSpec | None) -> dict[str, Any] | None:
    """A directory's default layout as an entry carries it (none when it sets nothing)."""
    return (spec.to_json() or None) if spec is not None else None


def listing_body(path: str, entries: Sequence[ListedEntry], next: str | None, *,
                 detail: bool = True) -> bytes:
    """The page's JSON bytes: ``Listing.to_json``'s object, compact, UTF-8.  Without
    ``detail`` each entry is its path and type."""
    shown: Sequence[ListedEntry] | Sequence[_Named] = (
        entries if detail else [_Named(e.path, e.type) for e in entries])
    try:
        return _encode(_Page(path, shown, next))
    except (TypeError, ValueError):
        # msgspec refuses what json escapes (a lone surrogate): json writes it, as before
        objects = [e.to_json() if detail else {"path": e.path, "type": e.type}
                   for e in entries]
        return json.dumps({"path": path, "entries": objects, "next": next},
                          separators=(",", ":")).encode()
