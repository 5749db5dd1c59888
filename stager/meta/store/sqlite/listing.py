"""A directory page: one range scan of the ``(parent, name)`` index, a tuple per row.

A listing is the one read that returns a thousand rows at once, so it builds no
object per row (:data:`~..base.Listed`; the server writes the page straight from
these), and it takes the layouts parsed once (``layout_of``: files written together
share one).  ``EXPLAIN QUERY PLAN`` of the scan: ``SEARCH entries USING INDEX
sqlite_autoindex_entries_1 (parent=? AND name>?)``, rows in the index's order, no
sort, no follow-up query per row.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from ....protocol.models import LayoutSpec
from ..base import Listed
from .db import attrs_from, layout_of, unpack

# The columns of a listed row, in :func:`listed`'s order (PostgreSQL's scan too).
LISTED = "name, kind, size, mtime, file_id, layout, checksums, attrs"
SCAN = f"SELECT {LISTED} FROM entries WHERE parent = ? AND name > ? ORDER BY name LIMIT ?"


def listed(base: str, row: Any) -> Listed:
    """One scanned row (the columns of ``LISTED``) as its :data:`Listed`."""
    name, kind, size, mtime, file_id, layout, blob, attrs = row
    if kind == "file":
        return (base + name, kind, size, mtime, file_id, layout_of(layout), None,
                unpack(blob), attrs_from(attrs))
    spec = LayoutSpec.from_json(json.loads(layout)) if layout else None
    return (base + name, kind, 0, mtime, None, None, spec, None, {})


def list_rows(db: sqlite3.Connection, dir_id: int, path: str, after: str, limit: int
              ) -> list[Listed]:
    """Up to ``limit`` children of directory ``dir_id`` (at ``path``) after ``after``."""
    base = path.rstrip("/") + "/"        # names in the table are single valid components
    return [listed(base, r) for r in db.execute(SCAN, (dir_id, after, limit))]
