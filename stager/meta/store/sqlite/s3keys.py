"""The SQL of S3 access keys in the SQLite store (the :class:`~..s3keys.S3Keys` role),
in a table of its own.  Blocking; runs on the store's one thread, through
:class:`SQLiteS3Keys`, which :class:`~.store.SQLiteStore` joins.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from ....errors import AlreadyExists
from ..s3keys import S3KeyRecord, S3Keys
from .db import Database
from .thread import StoreThread

SCHEMA = """
CREATE TABLE IF NOT EXISTS s3_keys (
    access_key TEXT PRIMARY KEY,
    token_id   TEXT NOT NULL,
    sealed     BLOB NOT NULL,
    created    INTEGER NOT NULL
);
"""
_COLS = "access_key, token_id, sealed, created"


def record_of(row: Sequence[Any]) -> S3KeyRecord:
    access_key, token_id, sealed, created = row
    return S3KeyRecord(str(access_key), str(token_id), bytes(sealed), int(created))


class S3KeySQL:
    def __init__(self, database: Database) -> None:
        self.database = database
        self.db = database.db
        self.db.executescript(SCHEMA)

    def put(self, records: Sequence[S3KeyRecord]) -> None:
        try:
            with self.database.transaction():
                self.db.executemany(f"INSERT INTO s3_keys ({_COLS}) VALUES (?, ?, ?, ?)",
                                    [(r.access_key, r.token_id, r.sealed, r.created)
                                     for r in records])
        except sqlite3.IntegrityError:
            raise AlreadyExists("an S3 access key of this batch exists already") from None

    def find(self, access_keys: Sequence[str]) -> dict[str, S3KeyRecord]:
        rows = self.db.execute(f"SELECT {_COLS} FROM s3_keys WHERE access_key IN "
                               "(SELECT value FROM json_each(?))",
                               (json.dumps(list(access_keys)),)).fetchall()
        return {r.access_key: r for r in map(record_of, rows)}

    def list(self) -> list[S3KeyRecord]:
        rows = self.db.execute(f"SELECT {_COLS} FROM s3_keys ORDER BY created, access_key")
        return [record_of(r) for r in rows.fetchall()]


class SQLiteS3Keys(S3Keys):
    """The :class:`S3Keys` role of :class:`~.store.SQLiteStore`."""

    thread: StoreThread
    s3keys: S3KeySQL

    async def put_s3_keys(self, records: Sequence[S3KeyRecord]) -> None:
        await self.thread.run(self.s3keys.put, list(records))

    async def find_s3_keys(self, access_keys: Sequence[str]) -> dict[str, S3KeyRecord]:
        return await self.thread.run(self.s3keys.find, list(access_keys))

    async def list_s3_keys(self) -> list[S3KeyRecord]:
        return await self.thread.run(self.s3keys.list)
