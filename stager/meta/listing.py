"""A listing page's entries as the server writes them, straight from the store's rows.

:meth:`MetaService.info <stager.meta.service.MetaService.info>` makes a stat's
FileInfo; a page of a thousand rows skips that object (and the NodeEntry before it)
and makes each entry's wire struct (:class:`~stager.protocol.listing.ListedEntry`)
from its row, with what ``info`` adds: the URLs of the layout's targets, and no
checksums for a cached file (its chunks are checked against their fills' CRCs).
The files of a directory mostly share one layout object (the store parses each
stored layout once), so a layout and its URLs are looked up and encoded once a page,
and a shared page (``layouts=shared``) sends them once, each entry naming its by index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from ..protocol.listing import ListedEntry, layout_parts, shared_layout, spec_json
from ..protocol.models import Layout
from .store.base import Listed


def wire_entries(rows: Sequence[Listed], locations: Callable[[Layout], dict[str, str]],
                 layouts: list[msgspec.Raw] | None = None) -> list[ListedEntry]:
    """The entries of ``rows``; ``locations(layout)``: the URL of each of its targets.
    With ``layouts`` (a shared page's, filled here) each distinct layout is appended
    to it once, and an entry names its layout by index; without, each distinct layout
    and its locations are encoded once and written into every entry of it."""
    # per distinct layout: what an entry of it carries as its layout and its locations
    parts: dict[int, tuple[msgspec.Raw | int, msgspec.Raw | None]] = {}
    out = []
    for path, kind, size, mtime, file_id, layout, spec, sums, attrs in rows:
        if layout is None:
            out.append(ListedEntry(path, kind, size, mtime, file_id,
                                   default_layout=spec_json(spec), checksums=_hex(sums),
                                   attrs=attrs))
            continue
        got = parts.get(id(layout))     # rows hold their layouts: an id is not reused
        if got is None:
            if layouts is None:
                got = layout_parts(layout, locations(layout))
            else:
                layouts.append(shared_layout(layout, locations(layout)))
                got = (len(layouts) - 1, None)
            parts[id(layout)] = got
        out.append(ListedEntry(path, kind, size, mtime, file_id, got[0], None,
                               None if layout.cached else _hex(sums), got[1], None, attrs))
    return out


def _hex(sums: tuple[int, ...] | None) -> Sequence[str] | None:
    # an empty file's (none) costs no comprehension, nor a list the collector tracks
    return None if sums is None else [f"{c:08x}" for c in sums] if sums else ()
