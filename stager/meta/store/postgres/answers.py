"""The SQL of recorded answers to requests sent with an idempotency key, on
PostgreSQL (the table: migration 2 in :mod:`.postgres.db`); see :mod:`.sqlite.answers`."""

from __future__ import annotations

import asyncpg


async def get(conn: asyncpg.Connection, key: str) -> tuple[int, bytes] | None:
    row = await conn.fetchrow("SELECT status, body FROM answers WHERE key = $1", key)
    return None if row is None else (int(row["status"]), bytes(row["body"]))


async def put(conn: asyncpg.Connection, key: str, status: int, body: bytes,
              now: float) -> bool:
    done = await conn.execute("INSERT INTO answers (key, status, body, created) "
                              "VALUES ($1, $2, $3, $4) ON CONFLICT (key) DO NOTHING",
                              key, status, body, now)
    return str(done).endswith(" 1")


async def put_lazily(conn: asyncpg.Connection, key: str, status: int, body: bytes,
                     now: float) -> bool:
    """:func:`put` as one statement of its own whose commit does not wait for the WAL
    flush (``stager_record_answer``, :mod:`.postgres.functions` says why that is enough)."""
    return bool(await conn.fetchval("SELECT stager_record_answer($1, $2, $3, $4)",
                                    key, status, body, now))


async def expire(conn: asyncpg.Connection, before: float) -> int:
    done = await conn.execute("DELETE FROM answers WHERE created < $1", before)
    return int(str(done).rsplit(" ", 1)[-1])
