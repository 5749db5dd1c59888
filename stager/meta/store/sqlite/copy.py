"""The SQLite store's SQL for copying a whole store: tables read page by page and
written back with their row ids (:mod:`stager.meta.store.migrate`).

Blocking; runs on the store's one thread.  Each load is one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ....protocol.models import LayoutSpec, attrs_text
from ..base import EntryRecord, Garbage, ManifestRecord
from .db import ROOT_ID, Database, attrs_from, layout_of, layout_text, pack, unpack

_ENTRY_COLS = "id, parent, name, kind, size, mtime, file_id, layout, checksums, attrs"


def entry_record(row: Sequence[Any]) -> EntryRecord:
    """A stored entry row (``_ENTRY_COLS``) as a record; shared with the PostgreSQL
    store, whose encodings are the same."""
    row_id, parent, name, kind, size, mtime, file_id, layout, blob, attrs = row
    if kind == "file":
        return EntryRecord(int(row_id), int(parent), str(name), kind, int(size), float(mtime),
                           file_id, layout=layout_of(layout), checksums=unpack(blob),
                           attrs=attrs_from(attrs))
    spec = LayoutSpec.from_json(json.loads(layout)) if layout else None
    return EntryRecord(int(row_id), int(parent), str(name), kind, 0, float(mtime),
                       default_layout=spec)


def entry_values(r: EntryRecord) -> tuple[Any, ...]:
    """A record as the stored row's values (``_ENTRY_COLS``), blob as bytes."""
    if r.kind == "file":
        assert r.layout is not None, f"file {r.name!r} (row {r.row}) has no layout"
        layout: str | None = layout_text(r.layout)
    else:
        spec = r.default_layout.to_json() if r.default_layout is not None else {}
        layout = json.dumps(spec) if spec else None
    blob = pack(r.checksums) if r.kind == "file" else None
    return (r.row, r.parent, r.name, r.kind, r.size, r.mtime, r.file_id, layout, blob,
            attrs_text(r.attrs) if r.kind == "file" else None)


class CopySQL:
    def __init__(self, database: Database) -> None:
        self.database = database
        self.db = database.db

    def dump_entries(self, *, after: int, limit: int) -> list[EntryRecord]:
        rows = self.db.execute(f"SELECT {_ENTRY_COLS} FROM entries WHERE id > ? "
                               "ORDER BY id LIMIT ?", (after, limit)).fetchall()
        return [entry_record(r) for r in rows]

    def load_entries(self, records: Sequence[EntryRecord]) -> None:
        with self.database.transaction():
            for r in records:
                values = entry_values(r)
                if r.row == ROOT_ID:
                    self.db.execute("UPDATE entries SET mtime = ?, layout = ? WHERE id = ?",
                                    (r.mtime, values[7], ROOT_ID))
                    continue
                self.db.execute(f"INSERT INTO entries ({_ENTRY_COLS}) "
                                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", values)

    def dump_manifests(self, *, after: int, limit: int) -> list[ManifestRecord]:
        rows = self.db.execute("SELECT dir_id, body, created FROM manifests WHERE dir_id > ? "
                               "ORDER BY dir_id LIMIT ?", (after, limit)).fetchall()
        return [ManifestRecord(int(r[0]), bytes(r[1]), float(r[2])) for r in rows]

    def load_manifests(self, records: Sequence[ManifestRecord]) -> None:
        with self.database.transaction():
            self.db.executemany("INSERT INTO manifests (dir_id, body, created) VALUES (?, ?, ?)",
                                [(r.dir_row, r.body, r.created) for r in records])

    def dump_garbage(self, *, after: str, limit: int) -> list[Garbage]:
        rows = self.db.execute("SELECT file_id, layout, size, since FROM garbage "
                               "WHERE file_id > ? ORDER BY file_id LIMIT ?",
                               (after, limit)).fetchall()
        return [Garbage(r[0], layout_of(r[1]), int(r[2]), float(r[3])) for r in rows]

    def load_garbage(self, items: Sequence[Garbage]) -> None:
        with self.database.transaction():
            self.db.executemany(
                "INSERT OR IGNORE INTO garbage (file_id, layout, size, since) "
                "VALUES (?, ?, ?, ?)",
                [(g.file_id, layout_text(g.layout), g.size, g.since) for g in items])
