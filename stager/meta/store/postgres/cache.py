"""The PostgreSQL store's SQL of the managed cache (the tables: migration 10 in
:mod:`.postgres.db`); see :mod:`.sqlite.cache`, whose row readers it shares.

Several metadata servers share these rows.  :func:`take_fill` is one upsert that
lets a lease through only when the row is new, the holder's own, or expired: two
servers' takes of one chunk serialize on its row (the second waits for the first
to commit, then finds the lease taken, or is aborted as a conflict and run again
by :meth:`.db.Database.statement`), so exactly one wins.  The counters and use
times :func:`touch_chunks` writes are committed without waiting for their WAL
flush: lost in a crash of the database they cost an eviction choice, never data.
Filled bytes count against the quotas above their files: charged by the transaction
that records a fill, refunded by the one that drops its row (as in :mod:`.sqlite.cache`).
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from ....errors import NotFound
from ....protocol import paths
from ..caching import AttachmentRecord, CachedChunk, CachedFile
from ..sqlite.cache import chunk_of, file_of, usage_of
from . import quotas

_ATTACHMENT = ("path, source, options, refresh, include, exclude, listed, created, "
               "hits, misses")
_FILE = "file_id, attachment, path, key, version"
_CHUNK = "c.file_id, c.idx, c.size, c.crc, c.filled, c.used, f.path, f.attachment"


def _attachment(r: asyncpg.Record) -> AttachmentRecord:
    return AttachmentRecord(r["path"], r["source"], bytes(r["options"]), r["refresh"],
                            tuple(r["include"]), tuple(r["exclude"]), r["listed"],
                            r["created"], r["hits"], r["misses"])


# -- attachments ---------------------------------------------------------------------------
async def put_attachment(conn: asyncpg.Connection, r: AttachmentRecord) -> None:
    await conn.execute(
        f"INSERT INTO attachments ({_ATTACHMENT}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, "
        "$9, $10) ON CONFLICT (path) DO UPDATE SET source = EXCLUDED.source, "
        "options = EXCLUDED.options, refresh = EXCLUDED.refresh, "
        "include = EXCLUDED.include, exclude = EXCLUDED.exclude, "
        "listed = EXCLUDED.listed, created = EXCLUDED.created",
        paths.normalize(r.path), r.source, r.options, r.refresh, list(r.include),
        list(r.exclude), r.listed, r.created, r.hits, r.misses)


async def attachments(conn: asyncpg.Connection) -> list[AttachmentRecord]:
    rows = await conn.fetch(f"SELECT {_ATTACHMENT} FROM attachments ORDER BY path")
    return [_attachment(r) for r in rows]


async def drop_attachment(conn: asyncpg.Connection, path: str) -> list[CachedFile]:
    path = paths.normalize(path)
    if await conn.execute("DELETE FROM attachments WHERE path = $1", path) != "DELETE 1":
        raise NotFound(f"{path} is not an attached directory", path=path)
    files = await cached_files(conn, path)
    await quotas.refund_chunks(conn, "c.file_id IN (SELECT file_id FROM cached_files "
                               "WHERE attachment = $1)", path)
    await conn.execute("DELETE FROM cache_chunks WHERE file_id IN "
                       "(SELECT file_id FROM cached_files WHERE attachment = $1)", path)
    await conn.execute("DELETE FROM cached_files WHERE attachment = $1", path)
    return files


# -- cached files ----------------------------------------------------------------------------
async def put_cached_files(conn: asyncpg.Connection, files: Sequence[CachedFile]) -> None:
    # one row per file id (the last given), as SQLite's upserts one by one leave it:
    # PostgreSQL refuses an upsert that would change one row twice
    files = list({f.file_id: f for f in files}.values())
    await conn.execute(
        f"INSERT INTO cached_files ({_FILE}) SELECT * FROM "
        "unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) "
        "ON CONFLICT (file_id) DO UPDATE SET attachment = EXCLUDED.attachment, "
        "path = EXCLUDED.path, key = EXCLUDED.key, version = EXCLUDED.version",
        [f.file_id for f in files], [paths.normalize(f.attachment) for f in files],
        [f.path for f in files], [f.key for f in files], [f.version for f in files])


async def cached_files(conn: asyncpg.Connection, attachment: str) -> list[CachedFile]:
    rows = await conn.fetch(f"SELECT {_FILE} FROM cached_files WHERE attachment = $1 "
                            "ORDER BY path", paths.normalize(attachment))
    return [file_of(tuple(r)) for r in rows]


async def find_cached(conn: asyncpg.Connection, file_ids: Sequence[str]
                      ) -> dict[str, CachedFile]:
    rows = await conn.fetch(f"SELECT {_FILE} FROM cached_files WHERE file_id = ANY($1::text[])",
                            list(file_ids))
    return {r["file_id"]: file_of(tuple(r)) for r in rows}


async def drop_cached_files(conn: asyncpg.Connection, file_ids: Sequence[str]) -> None:
    await quotas.refund_chunks(conn, "c.file_id = ANY($1::text[])", list(file_ids))
    await conn.execute("DELETE FROM cache_chunks WHERE file_id = ANY($1::text[])",
                       list(file_ids))
    await conn.execute("DELETE FROM cached_files WHERE file_id = ANY($1::text[])",
                       list(file_ids))


# -- chunks ------------------------------------------------------------------------------------
async def filled_chunks(conn: asyncpg.Connection, file_id: str, indexes: Sequence[int]
                        ) -> dict[int, int]:
    rows = await conn.fetch("SELECT idx, crc FROM cache_chunks WHERE file_id = $1 AND "
                            "idx = ANY($2::bigint[]) AND crc IS NOT NULL",
                            file_id, list(indexes))
    return {int(r["idx"]): int(r["crc"]) for r in rows}


async def take_fill(conn: asyncpg.Connection, file_id: str, index: int, holder: str,
                    until: float, now: float) -> bool:
    """One statement: safe to run twice (the second take is the holder's own)."""
    taken = await conn.fetchval(
        "INSERT INTO cache_chunks (file_id, idx, holder, until) VALUES ($1, $2, $3, $4) "
        "ON CONFLICT (file_id, idx) DO UPDATE SET holder = EXCLUDED.holder, "
        "until = EXCLUDED.until WHERE cache_chunks.crc IS NULL AND "
        "(cache_chunks.holder = EXCLUDED.holder OR cache_chunks.until <= $5) RETURNING true",
        file_id, index, holder, until, now)
    return bool(taken)


async def record_fill(conn: asyncpg.Connection, file_id: str, index: int, size: int,
                      crc: int, now: float) -> bool:
    path = await conn.fetchval("SELECT path FROM cached_files WHERE file_id = $1", file_id)
    if path is None:
        # the file was refreshed or detached: its lease goes too, so no row is left
        await conn.execute("DELETE FROM cache_chunks WHERE file_id = $1 AND idx = $2 "
                           "AND crc IS NULL", file_id, index)
        return False
    await quotas.charge_fill(conn, file_id, index, size, path)
    await conn.execute(
        "INSERT INTO cache_chunks (file_id, idx, size, crc, filled, used) "
        "VALUES ($1, $2, $3, $4, $5, $5) ON CONFLICT (file_id, idx) DO UPDATE SET "
        "size = EXCLUDED.size, crc = EXCLUDED.crc, filled = EXCLUDED.filled, "
        "used = EXCLUDED.used, holder = NULL, until = NULL",
        file_id, index, size, crc, now)
    return True


async def release_fill(conn: asyncpg.Connection, file_id: str, index: int,
                       holder: str) -> None:
    await conn.execute("DELETE FROM cache_chunks WHERE file_id = $1 AND idx = $2 "
                       "AND holder = $3 AND crc IS NULL", file_id, index, holder)


async def touch_chunks(conn: asyncpg.Connection, chunks: Sequence[tuple[str, int]],
                       now: float, counts: dict[str, tuple[int, int]] | None) -> None:
    await conn.execute("SET LOCAL synchronous_commit TO OFF")
    if chunks:
        await conn.execute(
            "UPDATE cache_chunks c SET used = GREATEST(c.used, $3) "
            "FROM unnest($1::text[], $2::bigint[]) AS t(file_id, idx) "
            "WHERE c.file_id = t.file_id AND c.idx = t.idx AND c.crc IS NOT NULL",
            [f for f, _ in chunks], [i for _, i in chunks], now)
    if counts:
        await conn.execute(
            "UPDATE attachments a SET hits = a.hits + t.hits, misses = a.misses + t.misses "
            "FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS t(path, hits, misses) "
            "WHERE a.path = t.path", [paths.normalize(a) for a in counts],
            [h for h, _ in counts.values()], [m for _, m in counts.values()])


async def cache_chunks(conn: asyncpg.Connection, after: tuple[str, int], limit: int
                       ) -> list[CachedChunk]:
    rows = await conn.fetch(
        f"SELECT {_CHUNK} FROM cache_chunks c JOIN cached_files f ON f.file_id = c.file_id "
        "WHERE c.crc IS NOT NULL AND (c.file_id, c.idx) > ($1, $2) "
        "ORDER BY c.file_id, c.idx LIMIT $3", after[0], after[1], limit)
    return [chunk_of(tuple(r)) for r in rows]


async def evict_chunks(conn: asyncpg.Connection, chunks: Sequence[tuple[str, int]]) -> None:
    await quotas.refund_chunks(
        conn, "(c.file_id, c.idx) IN (SELECT * FROM unnest($1::text[], $2::bigint[]))",
        [f for f, _ in chunks], [i for _, i in chunks])
    await conn.execute(
        "DELETE FROM cache_chunks c USING unnest($1::text[], $2::bigint[]) AS t(file_id, idx) "
        "WHERE c.file_id = t.file_id AND c.idx = t.idx AND c.crc IS NOT NULL",
        [f for f, _ in chunks], [i for _, i in chunks])


async def cache_usage(conn: asyncpg.Connection) -> dict[str, tuple[int, int, int, int]]:
    """In one snapshot (the caller's read transaction)."""
    names = [r[0] for r in await conn.fetch("SELECT path FROM attachments")]
    files = await conn.fetch(
        "SELECT f.attachment, COUNT(*), COALESCE(SUM(e.size), 0) FROM cached_files f "
        "JOIN entries e ON e.file_id = f.file_id GROUP BY f.attachment")
    chunks = await conn.fetch(
        "SELECT f.attachment, COUNT(*), COALESCE(SUM(c.size), 0) FROM cache_chunks c "
        "JOIN cached_files f ON f.file_id = c.file_id WHERE c.crc IS NOT NULL "
        "GROUP BY f.attachment")
    return usage_of(names, files, chunks)
