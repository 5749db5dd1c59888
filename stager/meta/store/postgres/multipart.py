"""The SQL of S3 multipart uploads in the PostgreSQL store (the
:class:`~..multipart.Multipart` role): the same tables and statements as SQLite's
(:mod:`..sqlite.multipart`), as coroutines over one connection inside the caller's
transaction, through :class:`PostgresMultipart`, which
:class:`~.store.PostgreSQLStore` joins.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

import asyncpg

from ....errors import NotFound
from ....protocol.models import Layout
from ..multipart import Multipart, MultipartRecord, PartRecord, hidden_files
from ..sqlite.db import layout_of, layout_text, pack, unpack

# schema version 11 (.postgres.db)
TABLES = """
CREATE TABLE IF NOT EXISTS multipart_uploads (
    upload_id TEXT PRIMARY KEY,
    path      TEXT COLLATE "C" NOT NULL,
    file_id   TEXT NOT NULL UNIQUE,
    layout    TEXT NOT NULL,
    part_size BIGINT,
    created   DOUBLE PRECISION NOT NULL,
    touched   DOUBLE PRECISION NOT NULL,
    extra     TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS multipart_uploads_path ON multipart_uploads (path, upload_id);
CREATE TABLE IF NOT EXISTS multipart_parts (
    upload_id   TEXT NOT NULL,
    number      INTEGER NOT NULL,
    file_id     TEXT NOT NULL,
    first_chunk BIGINT NOT NULL,
    size        BIGINT NOT NULL,
    md5         TEXT NOT NULL,
    checksums   BYTEA NOT NULL,
    written     DOUBLE PRECISION NOT NULL,
    layout      TEXT,
    PRIMARY KEY (upload_id, number)
);
"""
_RECORD = "upload_id, path, file_id, layout, part_size, created, touched, extra"
_PART = "number, file_id, first_chunk, size, md5, checksums, written, layout"
Op = Callable[[asyncpg.Connection], Awaitable[Any]]


def _record(r: asyncpg.Record) -> MultipartRecord:
    return MultipartRecord(r[0], r[1], r[2], layout_of(r[3]), r[4], r[5], r[6], r[7])


def _part(r: asyncpg.Record) -> PartRecord:
    return PartRecord(r[0], r[1], r[2], r[3], r[4], unpack(r[5]), r[6],
                      None if r[7] is None else layout_of(r[7]))


async def get(conn: asyncpg.Connection, upload_id: str, *, lock: bool = False
              ) -> MultipartRecord:
    row = await conn.fetchrow(f"SELECT {_RECORD} FROM multipart_uploads WHERE upload_id = $1"
                              + (" FOR UPDATE" if lock else ""), upload_id)
    if row is None:
        raise NotFound(f"no multipart upload {upload_id}", upload_id=upload_id)
    return _record(row)


async def _garbage(conn: asyncpg.Connection, files: Sequence[tuple[str, Layout]],
                   now: float) -> None:
    """``files`` (file id, the layout it was written in) go to garbage."""
    await conn.executemany(
        "INSERT INTO garbage VALUES ($1, $2, 0, $3) ON CONFLICT (file_id) DO NOTHING",
        [(f, layout_text(layout), now) for f, layout in files])


async def put_part(conn: asyncpg.Connection, upload_id: str, p: PartRecord) -> bool:
    # the touch is the check that the upload is still there, and takes its row's lock
    # (as the record's read FOR UPDATE did); the record is read only where a part of
    # another file is replaced (maybe a hidden part's chunks to collect)
    if await conn.fetchval("UPDATE multipart_uploads SET touched = greatest(touched, $1) "
                           "WHERE upload_id = $2 RETURNING 1", p.written, upload_id) is None:
        return False        # aborted meanwhile: a hidden part's chunks are orphans
    old = await conn.fetchrow(f"SELECT {_PART} FROM multipart_parts "
                              "WHERE upload_id = $1 AND number = $2", upload_id, p.number)
    if old is not None and old["file_id"] != p.file_id:
        record = await get(conn, upload_id)
        await _garbage(conn, hidden_files(record, [_part(old)], {p.file_id}), p.written)
    await conn.execute(
        f"INSERT INTO multipart_parts (upload_id, {_PART}) "
        "VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9) "
        "ON CONFLICT (upload_id, number) DO UPDATE SET file_id = EXCLUDED.file_id, "
        "first_chunk = EXCLUDED.first_chunk, size = EXCLUDED.size, md5 = EXCLUDED.md5, "
        "checksums = EXCLUDED.checksums, written = EXCLUDED.written, "
        "layout = EXCLUDED.layout",
        upload_id, p.number, p.file_id, p.first_chunk, p.size, p.md5, pack(p.checksums),
        p.written, None if p.layout is None else layout_text(p.layout))
    return True


async def parts(conn: asyncpg.Connection, upload_id: str) -> list[PartRecord]:
    return [_part(r) for r in await conn.fetch(
        f"SELECT {_PART} FROM multipart_parts WHERE upload_id = $1 ORDER BY number",
        upload_id)]


async def drop(conn: asyncpg.Connection, upload_id: str, keep: Collection[str],
               now: float) -> MultipartRecord:
    record = await get(conn, upload_id, lock=True)
    await _garbage(conn, hidden_files(record, await parts(conn, upload_id), keep), now)
    if record.file_id not in keep:      # the pending upload, as an abort drops it
        status = await conn.execute("DELETE FROM uploads WHERE file_id = $1", record.file_id)
        if status == "DELETE 1":
            await _garbage(conn, [(record.file_id, record.layout)], now)
    await conn.execute("DELETE FROM multipart_parts WHERE upload_id = $1", upload_id)
    await conn.execute("DELETE FROM multipart_uploads WHERE upload_id = $1", upload_id)
    return record


class PostgresMultipart(Multipart):
    """The :class:`Multipart` role of :class:`~.store.PostgreSQLStore`."""

    # the store's own: one transaction each, on its pool
    _read: Callable[..., Awaitable[Any]]
    _write: Callable[[Op], Awaitable[Any]]

    async def begin_multipart(self, r: MultipartRecord) -> None:
        await self._write(lambda c: c.execute(
            f"INSERT INTO multipart_uploads ({_RECORD}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8)",
            r.upload_id, r.path, r.file_id, layout_text(r.layout), r.part_size, r.created,
            r.touched, r.extra))

    async def get_multipart(self, upload_id: str) -> MultipartRecord:
        record: MultipartRecord = await self._read(lambda c: get(c, upload_id))
        return record

    async def fix_part_size(self, upload_id: str, size: int) -> int | None:
        async def fix(c: asyncpg.Connection) -> int | None:
            await c.execute("UPDATE multipart_uploads SET part_size = $1 "
                            "WHERE upload_id = $2 AND part_size IS NULL", size, upload_id)
            value = await c.fetchval("SELECT part_size FROM multipart_uploads "
                                     "WHERE upload_id = $1", upload_id)
            return None if value is None else int(value)

        result: int | None = await self._write(fix)
        return result

    async def put_part(self, upload_id: str, part: PartRecord) -> bool:
        return bool(await self._write(lambda c: put_part(c, upload_id, part)))

    async def list_parts(self, upload_id: str) -> list[PartRecord]:
        return list(await self._read(lambda c: parts(c, upload_id)))

    async def list_multipart(self, prefix: str, *, after: tuple[str, str],
                             limit: int) -> list[MultipartRecord]:
        rows = await self._read(lambda c: c.fetch(
            f"SELECT {_RECORD} FROM multipart_uploads WHERE starts_with(path, $1) "
            "AND (path, upload_id) > ($2, $3) ORDER BY path, upload_id LIMIT $4",
            prefix, after[0], after[1], limit))
        return [_record(r) for r in rows]

    async def drop_multipart(self, upload_id: str, *, keep: Collection[str], now: float
                             ) -> MultipartRecord:
        record: MultipartRecord = await self._write(lambda c: drop(c, upload_id, keep, now))
        return record

    async def idle_multipart(self, before: float) -> list[MultipartRecord]:
        rows = await self._read(lambda c: c.fetch(
            f"SELECT {_RECORD} FROM multipart_uploads WHERE touched < $1 ORDER BY touched",
            before))
        return [_record(r) for r in rows]
