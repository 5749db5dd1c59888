"""S3 access keys in the PostgreSQL store (the :class:`~..s3keys.S3Keys` role): the
table and statements of SQLite's (:mod:`..sqlite.s3keys`), through
:class:`PostgresS3Keys`, which :class:`~.store.PostgreSQLStore` joins.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg

from ....errors import AlreadyExists
from ..s3keys import S3KeyRecord, S3Keys

# schema version 12 (.postgres.db)
TABLES = """
CREATE TABLE IF NOT EXISTS s3_keys (
    access_key TEXT COLLATE "C" PRIMARY KEY,
    token_id   TEXT NOT NULL,
    sealed     BYTEA NOT NULL,
    created    BIGINT NOT NULL
);
"""
_COLS = "access_key, token_id, sealed, created"
Op = Callable[[asyncpg.Connection], Awaitable[Any]]


def _record(r: asyncpg.Record) -> S3KeyRecord:
    return S3KeyRecord(r[0], r[1], bytes(r[2]), int(r[3]))


class PostgresS3Keys(S3Keys):
    """The :class:`S3Keys` role of :class:`~.store.PostgreSQLStore`."""

    # the store's own: one transaction each, on its pool
    _read: Callable[..., Awaitable[Any]]
    _write: Callable[[Op], Awaitable[Any]]

    async def put_s3_keys(self, records: Sequence[S3KeyRecord]) -> None:
        rows = [(r.access_key, r.token_id, r.sealed, r.created) for r in records]
        try:
            await self._write(lambda c: c.executemany(
                f"INSERT INTO s3_keys ({_COLS}) VALUES ($1, $2, $3, $4)", rows))
        except asyncpg.UniqueViolationError:
            raise AlreadyExists("an S3 access key of this batch exists already") from None

    async def find_s3_keys(self, access_keys: Sequence[str]) -> dict[str, S3KeyRecord]:
        rows = await self._read(lambda c: c.fetch(
            f"SELECT {_COLS} FROM s3_keys WHERE access_key = ANY($1::text[])",
            list(access_keys)))
        return {r.access_key: r for r in map(_record, rows)}

    async def list_s3_keys(self) -> list[S3KeyRecord]:
        rows = await self._read(lambda c: c.fetch(
            f"SELECT {_COLS} FROM s3_keys ORDER BY created, access_key"))
        return [_record(r) for r in rows]
