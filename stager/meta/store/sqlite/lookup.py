"""A path's row in one statement: a join of ``entries`` down from the root.

A stat walking ``/a/b/c`` one component at a time in a read transaction (so that it
sees one committed state, never half of a rename) made five statements on the
reader: BEGIN, three look-ups, COMMIT, each some 3-5 us of the metadata server's
loop.  One statement is consistent by itself, so a path that is there is found in
one; one that is not (or is deeper than the join goes) is walked as before, and the
walk says which component is missing or not a directory.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from typing import Any

from .db import ROOT_ID

MAX_JOINED = 32            # path components one statement walks (SQLite joins up to 64)


def joined_row(db: sqlite3.Connection, names: Sequence[str], cols: str
               ) -> tuple[Any, ...] | None:
    """The ``cols`` of the entry at the path of ``names`` (each but the last a
    directory), or None: not all there, the root (no names), or deeper than
    :data:`MAX_JOINED`."""
    if not names or len(names) > MAX_JOINED:
        return None
    row: tuple[Any, ...] | None = db.execute(
        _walk_sql(len(names), cols), (*names[1:], ROOT_ID, names[0])).fetchone()
    return row


@functools.lru_cache(maxsize=2 * MAX_JOINED)
def _walk_sql(depth: int, cols: str) -> str:
    """The statement for a path of ``depth`` components; its parameters are the names
    below the first, then the root's id and the first name (the order of their ``?``)."""
    last = depth - 1
    joins = "".join(f" JOIN entries AS e{i} ON e{i}.parent = e{i - 1}.id AND e{i}.name = ?"
                    + (f" AND e{i}.kind = 'directory'" if i < last else "")
                    for i in range(1, depth))
    first_is_dir = " AND e0.kind = 'directory'" if depth > 1 else ""
    picked = ", ".join(f"e{last}.{c.strip()}" for c in cols.split(","))
    return (f"SELECT {picked} FROM entries AS e0{joins} "
            f"WHERE e0.parent = ? AND e0.name = ?{first_is_dir}")
