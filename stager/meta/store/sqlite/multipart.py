"""The SQL of S3 multipart uploads in the SQLite store (the :class:`~..multipart.Multipart`
role): records and parts, in tables of their own.  Blocking; runs on the store's one
thread, through :class:`SQLiteMultipart`, which :class:`~.store.SQLiteStore` joins.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from ....errors import NotFound
from ....protocol.models import Layout
from ..multipart import Multipart, MultipartRecord, PartRecord, hidden_files
from .db import Database, layout_of, layout_text, pack, unpack
from .thread import StoreThread

SCHEMA = """
CREATE TABLE IF NOT EXISTS multipart_uploads (
    upload_id TEXT PRIMARY KEY,
    path      TEXT NOT NULL,
    file_id   TEXT NOT NULL UNIQUE,
    layout    TEXT NOT NULL,
    part_size INTEGER,
    created   REAL NOT NULL,
    touched   REAL NOT NULL,
    extra     TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS multipart_uploads_path ON multipart_uploads (path, upload_id);
CREATE TABLE IF NOT EXISTS multipart_parts (
    upload_id   TEXT NOT NULL,
    number      INTEGER NOT NULL,
    file_id     TEXT NOT NULL,
    first_chunk INTEGER NOT NULL,
    size        INTEGER NOT NULL,
    md5         TEXT NOT NULL,
    checksums   BLOB NOT NULL,
    written     REAL NOT NULL,
    layout      TEXT,
    PRIMARY KEY (upload_id, number)
);
"""
_RECORD = "upload_id, path, file_id, layout, part_size, created, touched, extra"
_PART = "number, file_id, first_chunk, size, md5, checksums, written, layout"


def record_of(row: Sequence[Any]) -> MultipartRecord:
    upload_id, path, file_id, layout, part_size, created, touched, extra = row
    return MultipartRecord(upload_id, path, file_id, layout_of(layout), part_size, created,
                           touched, extra)


def part_of(row: Sequence[Any]) -> PartRecord:
    number, file_id, first_chunk, size, md5, checksums, written, layout = row
    return PartRecord(number, file_id, first_chunk, size, md5, unpack(checksums), written,
                      None if layout is None else layout_of(layout))


class MultipartSQL:
    def __init__(self, database: Database) -> None:
        self.database = database
        self.db = database.db
        self.db.executescript(SCHEMA)

    def begin(self, r: MultipartRecord) -> None:
        with self.database.transaction():
            self.db.execute(f"INSERT INTO multipart_uploads ({_RECORD}) VALUES (?,?,?,?,?,?,?,?)",
                            (r.upload_id, r.path, r.file_id, layout_text(r.layout),
                             r.part_size, r.created, r.touched, r.extra))

    def get(self, upload_id: str) -> MultipartRecord:
        row = self.db.execute(f"SELECT {_RECORD} FROM multipart_uploads WHERE upload_id = ?",
                              (upload_id,)).fetchone()
        if row is None:
            raise NotFound(f"no multipart upload {upload_id}", upload_id=upload_id)
        return record_of(row)

    def fix_part_size(self, upload_id: str, size: int) -> int | None:
        with self.database.transaction():
            self.db.execute("UPDATE multipart_uploads SET part_size = ? "
                            "WHERE upload_id = ? AND part_size IS NULL", (size, upload_id))
            row = self.db.execute("SELECT part_size FROM multipart_uploads WHERE upload_id = ?",
                                  (upload_id,)).fetchone()
        return None if row is None else int(row[0])

    def put_part(self, upload_id: str, p: PartRecord) -> bool:
        with self.database.transaction():
            # the touch is the check that the upload is still there (no record read)
            if not self.db.execute("UPDATE multipart_uploads SET touched = max(touched, ?) "
                                   "WHERE upload_id = ?", (p.written, upload_id)).rowcount:
                return False        # aborted meanwhile: a hidden part's chunks are orphans
            old = self.db.execute("SELECT file_id FROM multipart_parts "
                                  "WHERE upload_id = ? AND number = ?",
                                  (upload_id, p.number)).fetchone()
            if old is not None and old[0] != p.file_id:     # maybe a hidden part replaced
                record = self.get(upload_id)
                self._garbage(hidden_files(record, [part_of(self.db.execute(
                    f"SELECT {_PART} FROM multipart_parts WHERE upload_id = ? AND number = ?",
                    (upload_id, p.number)).fetchone())], {p.file_id}), now=p.written)
            self.db.execute(f"INSERT OR REPLACE INTO multipart_parts (upload_id, {_PART}) "
                            "VALUES (?,?,?,?,?,?,?,?,?)",
                            (upload_id, p.number, p.file_id, p.first_chunk, p.size, p.md5,
                             pack(p.checksums), p.written,
                             None if p.layout is None else layout_text(p.layout)))
        return True

    def parts(self, upload_id: str) -> list[PartRecord]:
        return [part_of(r) for r in self.db.execute(
            f"SELECT {_PART} FROM multipart_parts WHERE upload_id = ? ORDER BY number",
            (upload_id,))]

    def page(self, prefix: str, after: tuple[str, str], limit: int) -> list[MultipartRecord]:
        return [record_of(r) for r in self.db.execute(
            f"SELECT {_RECORD} FROM multipart_uploads WHERE substr(path, 1, ?) = ? "
            "AND (path, upload_id) > (?, ?) ORDER BY path, upload_id LIMIT ?",
            (len(prefix), prefix, after[0], after[1], limit))]

    def drop(self, upload_id: str, keep: Collection[str], now: float) -> MultipartRecord:
        with self.database.transaction():
            record = self.get(upload_id)
            self._garbage(hidden_files(record, self.parts(upload_id), keep), now=now)
            if record.file_id not in keep:      # the pending upload, as an abort drops it
                gone = self.db.execute("DELETE FROM uploads WHERE file_id = ?",
                                       (record.file_id,)).rowcount
                if gone:
                    self._garbage([(record.file_id, record.layout)], now=now)
            self.db.execute("DELETE FROM multipart_parts WHERE upload_id = ?", (upload_id,))
            self.db.execute("DELETE FROM multipart_uploads WHERE upload_id = ?", (upload_id,))
        return record

    def idle(self, before: float) -> list[MultipartRecord]:
        return [record_of(r) for r in self.db.execute(
            f"SELECT {_RECORD} FROM multipart_uploads WHERE touched < ? ORDER BY touched",
            (before,))]

    def _garbage(self, files: Sequence[tuple[str, Layout]], *, now: float) -> None:
        """``files`` (file id, the layout it was written in) go to garbage."""
        self.db.executemany("INSERT OR REPLACE INTO garbage VALUES (?, ?, ?, ?)",
                            [(f, layout_text(layout), 0, now) for f, layout in files])


class SQLiteMultipart(Multipart):
    """The :class:`Multipart` role of :class:`~.store.SQLiteStore`."""

    thread: StoreThread
    multipart: MultipartSQL

    async def begin_multipart(self, record: MultipartRecord) -> None:
        await self.thread.run(self.multipart.begin, record)

    async def get_multipart(self, upload_id: str) -> MultipartRecord:
        return await self.thread.run(self.multipart.get, upload_id)

    async def fix_part_size(self, upload_id: str, size: int) -> int | None:
        return await self.thread.run(self.multipart.fix_part_size, upload_id, size)

    async def put_part(self, upload_id: str, part: PartRecord) -> bool:
        return await self.thread.write(self.multipart.put_part, upload_id, part)

    async def list_parts(self, upload_id: str) -> list[PartRecord]:
        return await self.thread.run(self.multipart.parts, upload_id)

    async def list_multipart(self, prefix: str, *, after: tuple[str, str],
                             limit: int) -> list[MultipartRecord]:
        return await self.thread.run(self.multipart.page, prefix, after, limit)

    async def drop_multipart(self, upload_id: str, *, keep: Collection[str], now: float
                             ) -> MultipartRecord:
        return await self.thread.run(self.multipart.drop, upload_id, keep, now)

    async def idle_multipart(self, before: float) -> list[MultipartRecord]:
        return await self.thread.run(self.multipart.idle, before)
