"""A directory page (and a stat) read quickly: ``Listing.from_json`` for the shape servers send.

A 1,000-entry page took ``FileInfo.from_json`` some 40 ms on a busy machine, most
of a listing's time: every field goes through ``field_of``, and every entry's
layout through ``Layout.from_json`` (its checks, a ``LayoutSpec`` validated),
though the files of a directory mostly share one layout.  :func:`listing_of`
builds the same :class:`~stager.protocol.messages.Listing`: an entry of the usual
shape (the fields below, each of its exact JSON type or null) directly, its layout
parsed by ``Layout.from_json`` once per distinct layout in the page (a Layout is
immutable, so entries share it); any other entry through ``FileInfo.from_json``,
which accepts or refuses it as it always did.

:func:`listing_from_bytes` goes one step further for the page's bytes: msgspec
decodes them straight into typed structs (no dict per entry), checking the types
and bounds ``FileInfo.from_json`` checks; a page it refuses for any reason is read
again by :func:`listing_of`, which gives the answer or the error it always gave.
:func:`info_from_bytes` reads a stat's answer the same way.

A shared page (``layouts=shared``: each layout once, entries naming theirs by index)
reads as the page :func:`~stager.protocol.listing.unshared` makes of it: its
layouts are made once, and the entries of one share its Layout and its URLs.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any

import msgspec

from ..errors import StagerError
from ..protocol.listing import SHARED, unshared
from ..protocol.messages import Listing
from ..protocol.models import INT64_MAX, FileInfo, Layout, LayoutSpec, attrs_of, field_of

__all__ = ["SHARED", "info_from_bytes", "listing_from_bytes", "listing_of"]

# The fields an entry of the usual shape may have (a directory's default layout or a
# version's attrs send the entry the long way).
PLAIN = frozenset({"path", "type", "size", "mtime", "file_id", "layout", "checksums",
                   "locations"})


def listing_of(obj: Any) -> Listing:
    """``Listing.from_json(obj)``, quicker for the entries servers send."""
    if not isinstance(obj, dict):
        return Listing.from_json(obj)
    obj = unshared(obj)
    layouts: dict[tuple[Any, ...], Layout] = {}
    path = field_of(obj, "path", str)           # checked in from_json's order
    entries = tuple(_entry(e, layouts) for e in field_of(obj, "entries", list))
    return Listing(path=path, entries=entries, next=field_of(obj, "next", str, None))


def _entry(e: Any, layouts: dict[tuple[Any, ...], Layout]) -> FileInfo:
    if type(e) is not dict or not PLAIN.issuperset(e):
        return FileInfo.from_json(e)
    path, kind = e.get("path"), e.get("type")
    size, mtime = e.get("size"), e.get("mtime")
    file_id, sums, where = e.get("file_id"), e.get("checksums"), e.get("locations")
    if (type(path) is not str or type(kind) is not str
            or (size is not None and (type(size) is not int or not 0 <= size <= INT64_MAX))
            or (mtime is not None and type(mtime) is not float and type(mtime) is not int)
            or (file_id is not None and type(file_id) is not str)
            or (sums is not None and type(sums) is not list)
            or (where is not None and type(where) is not dict)):
        return FileInfo.from_json(e)
    layout = e.get("layout")
    if layout is not None:
        layout = _layout(layout, layouts)
        if layout is None:
            return FileInfo.from_json(e)
    return FileInfo(path=path, type=kind, size=size or 0,
                    mtime=float(mtime) if mtime is not None else 0.0, file_id=file_id,
                    layout=layout,
                    checksums=tuple(int(c, 16) for c in sums) if sums is not None else None,
                    locations=dict(where) if where else {})


def _layout(obj: Any, layouts: dict[tuple[Any, ...], Layout]) -> Layout | None:
    """The page's Layout for ``obj``, parsed by ``Layout.from_json`` the first time (a
    layout it refuses is never kept); ``None`` when ``obj`` is not a JSON object or
    holds what cannot be a key (the entry goes the long way).  The key holds each
    number's type: ``True == 1``, but from_json takes only the one."""
    if type(obj) is not dict:
        return None
    get = obj.get
    size, count, copies = get("chunk_size"), get("stripe_count"), get("replicas")
    targets, nodes, cached = get("targets"), get("nodes"), get("cached")
    try:
        key = (type(size), size, type(count), count, type(copies), copies,
               tuple(targets) if type(targets) is list else targets,
               tuple(nodes) if type(nodes) is list else nodes, type(cached), cached)
        layout = layouts.get(key)
    except TypeError:                   # unhashable: a list or an object in there
        return None
    if layout is None:
        layout = layouts[key] = Layout.from_json(obj)
    return layout


# -- straight from the bytes ---------------------------------------------------------
# The structs are untracked by the garbage collector (gc=False): decoded JSON holds no
# cycle, and a page's thousand entries each tracked made the collections that ran while
# decoding it more than half its time (0.5 -> 0.2 ms a 1,000-entry page).
Count = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]


class _Layout(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """A layout as sent; hashable, the key of its Layout (:func:`_layout_of`)."""

    chunk_size: Count
    stripe_count: int
    replicas: int
    targets: tuple[str, ...]
    nodes: tuple[str, ...]
    cached: bool = False


class _Shared(_Layout):
    """A layout of a shared page's ``layouts``, with its targets' URLs (not hashable:
    its layout is looked up as the :class:`_Layout` of its other fields)."""

    locations: dict[str, str] = {}


class _Entry(msgspec.Struct, gc=False):
    # Optional fields have no null here: from_json reads a null as the default, and
    # such a (rare) page goes the long way.
    path: str
    type: str
    size: Count = 0
    mtime: float = 0.0
    file_id: str | None = None
    layout: _Layout | int | None = None         # int: an index into a shared page's
    default_layout: dict[str, Any] | None = None
    checksums: list[str] | None = None
    locations: dict[str, str] = {}
    capability: str | None = None
    attrs: dict[str, Any] = {}


class _Page(msgspec.Struct, gc=False):
    path: str
    entries: list[_Entry]
    next: str | None = None
    layouts: list[_Shared] | None = None


_read_page = msgspec.json.Decoder(_Page).decode
_read_any = msgspec.json.Decoder().decode


def listing_from_bytes(raw: bytes) -> Listing:
    """The :class:`Listing` a page's JSON bytes hold: what
    ``Listing.from_json(json.loads(raw))`` gives, the same Listing or the same error
    (a ``ValueError`` where ``raw`` is not JSON at all)."""
    try:
        page = _read_page(raw)
    except msgspec.ValidationError:
        return listing_of(_read_any(raw))
    try:
        if page.layouts is None:
            entries = tuple([_info(e) for e in page.entries])
        else:
            table = [(_layout_of(_Layout(s.chunk_size, s.stripe_count, s.replicas, s.targets,
                                         s.nodes, s.cached)), s.locations) for s in page.layouts]
            entries = tuple([_info(e, table) for e in page.entries])
    except (StagerError, ValueError, IndexError):   # what from_json refuses, a bad index
        return listing_of(_read_any(raw))
    return Listing(path=page.path, entries=entries, next=page.next)


_read_info = msgspec.json.Decoder(_Entry).decode


def info_from_bytes(raw: bytes) -> FileInfo:
    """The :class:`FileInfo` a stat's JSON bytes hold: what
    ``FileInfo.from_json(json.loads(raw))`` gives, the same FileInfo or the same error."""
    try:
        return _info(_read_info(raw))
    except (msgspec.ValidationError, StagerError, ValueError):
        return FileInfo.from_json(_read_any(raw))


_new = object.__new__


def _info(e: _Entry, table: list[tuple[Layout, dict[str, str]]] | None = None
          ) -> FileInfo:
    """``e``'s FileInfo; ``table``: a shared page's layouts, each with its URLs."""
    layout = e.layout
    where = e.locations
    if layout is not None:
        if type(layout) is int:
            if table is None or layout < 0:
                raise ValueError("a layout index outside a shared page")
            layout, shared = table[layout]      # IndexError: past the page's layouts
            where = where or shared
        else:
            layout = _layout_of(layout)
    sums = e.checksums
    # FileInfo(...) itself, less its frozen __init__, which sets each of the eleven
    # fields through object.__setattr__: two thirds of a 1,000-entry page's building.
    # The fields are checked above; test_listing_fast.py holds the two alike.
    info = _new(FileInfo)
    info.__dict__.update(
        path=e.path, type=e.type, size=e.size, mtime=e.mtime, file_id=e.file_id,
        layout=layout,
        default_layout=LayoutSpec.from_json(e.default_layout) if e.default_layout else None,
        checksums=(tuple([int(c, 16) for c in sums]) if sums else ()) if sums is not None
        else None,
        locations=where, capability=e.capability,
        attrs=attrs_of({"attrs": e.attrs}) if e.attrs else {})
    return info


@functools.lru_cache(maxsize=4096)
def _layout_of(wire: _Layout) -> Layout:
    """The Layout ``wire`` describes, made and checked by ``Layout.from_json`` (which
    raises where it refuses: never kept).  Files written together share one, and a
    Layout is immutable: stats and pages of them share the object."""
    return Layout.from_json(msgspec.structs.asdict(wire)
                            | {"targets": list(wire.targets), "nodes": list(wire.nodes)})
