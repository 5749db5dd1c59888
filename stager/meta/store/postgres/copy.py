"""The PostgreSQL store's SQL for copying a whole store: tables read page by page and
written back with their row ids (:mod:`stager.meta.store.migrate`).

Coroutines over one connection, inside the transaction :class:`~.postgres.db.Database`
opens.  Entries keep their row ids, so after loading them the identity sequence
is moved past the largest: the next directory or file made gets a fresh id.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from ..base import EntryRecord, Garbage, ManifestRecord
from ..sqlite.copy import entry_record, entry_values
from ..sqlite.db import layout_of, layout_text
from .db import ROOT_ID

_ENTRY_COLS = "id, parent, name, kind, size, mtime, file_id, layout, checksums, attrs"

async def dump_entries(conn: asyncpg.Connection, after: int, limit: int) -> list[EntryRecord]:
    rows = await conn.fetch(f"SELECT {_ENTRY_COLS} FROM entries WHERE id > $1 "
                            "ORDER BY id LIMIT $2", after, limit)
    return [entry_record(tuple(r)) for r in rows]


async def load_entries(conn: asyncpg.Connection, records: Sequence[EntryRecord]) -> None:
    values = [entry_values(r) for r in records]
    for r, v in zip(records, values, strict=True):
        if r.row == ROOT_ID:
            await conn.execute("UPDATE entries SET mtime = $1, layout = $2 WHERE id = $3",
                               r.mtime, v[7], ROOT_ID)
    rest = [v for r, v in zip(records, values, strict=True) if r.row != ROOT_ID]
    if rest:
        await conn.executemany(f"INSERT INTO entries ({_ENTRY_COLS}) "
                               "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)", rest)
    await conn.execute("SELECT setval(pg_get_serial_sequence('entries', 'id'), "
                       "(SELECT max(id) FROM entries))")


async def dump_manifests(conn: asyncpg.Connection, after: int, limit: int
                         ) -> list[ManifestRecord]:
    rows = await conn.fetch("SELECT dir_id, body, created FROM manifests WHERE dir_id > $1 "
                            "ORDER BY dir_id LIMIT $2", after, limit)
    return [ManifestRecord(int(r[0]), bytes(r[1]), float(r[2])) for r in rows]


async def load_manifests(conn: asyncpg.Connection, records: Sequence[ManifestRecord]) -> None:
    await conn.executemany("INSERT INTO manifests (dir_id, body, created) VALUES ($1, $2, $3)",
                           [(r.dir_row, r.body, r.created) for r in records])


async def dump_garbage(conn: asyncpg.Connection, after: str, limit: int) -> list[Garbage]:
    rows = await conn.fetch("SELECT file_id, layout, size, since FROM garbage "
                            "WHERE file_id > $1 ORDER BY file_id LIMIT $2", after, limit)
    return [Garbage(r[0], layout_of(r[1]), int(r[2]), float(r[3])) for r in rows]


async def load_garbage(conn: asyncpg.Connection, items: Sequence[Garbage]) -> None:
    await conn.executemany(
        "INSERT INTO garbage (file_id, layout, size, since) VALUES ($1, $2, $3, $4) "
        "ON CONFLICT (file_id) DO NOTHING",
        [(g.file_id, layout_text(g.layout), g.size, g.since) for g in items])
