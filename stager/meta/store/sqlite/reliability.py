"""The SQL of rebuild, repair and fsck: committed files by id and by target.

Files are found by id (an index on ``entries.file_id``) and by the targets their
layout names (SQLite's JSON1 ``json_each`` over the stored layout).  A layout is
replaced by compare-and-swap, so a rebuild never overwrites a newer layout and
never resurrects a file deleted while its chunks were being copied.
"""

from __future__ import annotations

from typing import Any

from ....protocol.models import Layout
from ..base import StoredFile
from .db import Database, layout_of, layout_text, unpack

_FILE_COLS = "id, file_id, size, layout, checksums"


def _stored(row: tuple[Any, ...]) -> StoredFile:
    row_id, file_id, size, layout, blob = row
    return StoredFile(row=int(row_id), file_id=str(file_id), size=int(size),
                      layout=layout_of(layout), checksums=unpack(blob))


class ReliabilitySQL:
    """Committed files as the background duties see them: by id, without paths."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.db = database.db

    def file_by_id(self, file_id: str) -> StoredFile | None:
        row = self.db.execute(
            f"SELECT {_FILE_COLS} FROM entries WHERE file_id = ? AND kind = 'file'",
            (file_id,)).fetchone()
        return _stored(row) if row is not None else None

    def path_of_file(self, file_id: str) -> str | None:
        rows = self.db.execute(
            "WITH RECURSIVE up(id, parent, name, depth) AS ("
            " SELECT id, parent, name, 0 FROM entries WHERE file_id = ? AND kind = 'file'"
            " UNION ALL SELECT e.id, e.parent, e.name, up.depth + 1"
            " FROM entries e JOIN up ON e.id = up.parent)"
            " SELECT name FROM up ORDER BY depth DESC", (file_id,)).fetchall()
        if not rows:
            return None
        return "/" + "/".join(r[0] for r in rows if r[0])

    def files_page(self, *, after: int, limit: int,
                   targets: frozenset[str] | None = None) -> list[StoredFile]:
        if targets is None:
            rows = self.db.execute(
                f"SELECT {_FILE_COLS} FROM entries WHERE kind = 'file' AND id > ? "
                "ORDER BY id LIMIT ?", (after, limit)).fetchall()
            return [_stored(r) for r in rows]
        if not targets:
            return []
        marks = ", ".join("?" for _ in targets)
        rows = self.db.execute(
            f"SELECT {_FILE_COLS} FROM entries WHERE kind = 'file' AND id > ? AND EXISTS "
            f"(SELECT 1 FROM json_each(entries.layout, '$.targets') WHERE value IN ({marks})) "
            "ORDER BY id LIMIT ?", (after, *sorted(targets), limit)).fetchall()
        return [_stored(r) for r in rows]

    def replace_layout(self, file_id: str, old: Layout, new: Layout) -> bool:
        with self.database.transaction():
            cur = self.db.execute(
                "UPDATE entries SET layout = ? WHERE file_id = ? AND kind = 'file' "
                "AND layout = ?", (layout_text(new), file_id, layout_text(old)))
            if cur.rowcount != 1:
                return False
            parent = self.db.execute("SELECT parent FROM entries WHERE file_id = ? AND "
                                     "kind = 'file'", (file_id,)).fetchone()
            self.database.changed_below(int(parent[0]))
            return True
