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

Still, those layouts and URLs, repeated in every entry, were 56% of a 1,000-entry
page's bytes and half its decoding.  A client that asks ``layouts=shared``
(:data:`SHARED`) gets each distinct layout once, in the page's ``layouts`` (with
its targets' URLs as ``locations``), and each entry names it by index: ``"layout":
0``.  :func:`unshared` says what such a page stands for.  Without it a page is
as it always was, for the clients that never ask.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import msgspec

from ..errors import BadRequest
from .models import Layout, LayoutSpec

SHARED = "shared"       # the listing route's ``layouts`` value: each layout once a page


class ListedEntry(msgspec.Struct, omit_defaults=True, gc=False):
    """One entry of a page: the object ``FileInfo.to_json`` writes.  ``size`` and
    ``mtime`` have no default, so they are always written, as there; the others are
    left out at their default (None, or an empty ``attrs``), as there.  Untracked by
    the garbage collector (it holds no cycle): a page's thousand tracked entries set
    off collections that took half the time of building it."""

    path: str
    type: str
    size: int
    mtime: float
    file_id: str | None = None
    layout: msgspec.Raw | int | None = None     # an index into a shared page's layouts
    default_layout: dict[str, Any] | None = None
    checksums: Sequence[str] | None = None
    locations: msgspec.Raw | None = None
    capability: str | None = None
    attrs: dict[str, Any] = {}

    def to_json(self) -> dict[str, Any]:
        """The same object as plain JSON (for ``json``, which cannot write Raw)."""
        out = msgspec.structs.asdict(self)
        for key in ("layout", "locations"):
            if isinstance(out[key], msgspec.Raw):
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


class _SharedPage(msgspec.Struct):
    path: str
    layouts: Sequence[msgspec.Raw]
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


def shared_layout(layout: Layout, locations: dict[str, str]) -> msgspec.Raw:
    """A layout as a shared page's ``layouts`` holds it: with its targets' URLs."""
    return raw(layout.to_json() | {"locations": locations} if locations else layout.to_json())


def spec_json(spec: LayoutSpec | None) -> dict[str, Any] | None:
    """A directory's default layout as an entry carries it (none when it sets nothing)."""
    return (spec.to_json() or None) if spec is not None else None


def listing_body(path: str, entries: Sequence[ListedEntry], next: str | None, *,
                 detail: bool = True, layouts: Sequence[msgspec.Raw] | None = None) -> bytes:
    """The page's JSON bytes: ``Listing.to_json``'s object, compact, UTF-8.  Without
    ``detail`` each entry is its path and type.  With ``layouts`` (entries that name
    theirs by index) a shared page: those layouts first, after ``path``."""
    shown: Sequence[ListedEntry] | Sequence[_Named] = (
        entries if detail else [_Named(e.path, e.type) for e in entries])
    try:
        if layouts is not None:
            return _encode(_SharedPage(path, layouts if detail else [], shown, next))
        return _encode(_Page(path, shown, next))
    except (TypeError, ValueError):
        # msgspec refuses what json escapes (a lone surrogate): json writes it, as before
        objects = [e.to_json() if detail else {"path": e.path, "type": e.type}
                   for e in entries]
        page: dict[str, Any] = {"path": path, "entries": objects, "next": next}
        if layouts is not None:
            page = {"path": path, "layouts": [json.loads(bytes(r)) for r in layouts]
                    if detail else [], **page}
        return json.dumps(page, separators=(",", ":")).encode()


def wants_shared(value: str | None) -> bool:
    """Whether the listing route's ``layouts`` query value asks for a shared page."""
    if value is None or value == "":
        return False
    if value != SHARED:
        raise BadRequest(f"query parameter layouts must be {SHARED!r}")
    return True


def unshared(obj: Any) -> Any:
    """The page a shared one stands for: each entry that names a layout by index
    holds that layout instead, and its URLs as the entry's ``locations`` where it has
    none.  Anything else is left as it is (``Listing.from_json`` judges it); an index
    or a layout that cannot be is a :class:`BadRequest`."""
    if not isinstance(obj, dict) or "layouts" not in obj:
        return obj
    shared = obj["layouts"]
    if type(shared) is not list:
        raise BadRequest("field 'layouts' must be a list")
    table = []
    for i, item in enumerate(shared):
        if type(item) is not dict:
            raise BadRequest(f"layouts[{i}] must be an object")
        item = dict(item)
        table.append((item, item.pop("locations", None)))
    page = {k: v for k, v in obj.items() if k != "layouts"}
    if type(page.get("entries")) is list:
        page["entries"] = [_unshared_entry(e, table) for e in page["entries"]]
    return page


def _unshared_entry(e: Any, table: list[tuple[dict[str, Any], Any]]) -> Any:
    if type(e) is not dict or type(e.get("layout")) is not int:      # a bool is no index
        return e
    index = e["layout"]
    if not 0 <= index < len(table):
        raise BadRequest(f"layout {index} of entry {e.get('path')!r}: the page has "
                         f"{len(table)} layouts")
    layout, where = table[index]
    out = {**e, "layout": layout}
    if where is not None and not e.get("locations"):
        out["locations"] = where
    return out
