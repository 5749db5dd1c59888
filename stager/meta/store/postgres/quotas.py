"""The PostgreSQL store's SQL of quotas and pins (as :mod:`.sqlite.quotas`, whose check
and error it shares).

A commit charges the quotas above its file inside ``stager_commit``
(:data:`.functions.QUOTA_COMMIT_FUNCTION`; a cached file at 0 bytes since
:data:`.functions.CACHED_COMMIT_FUNCTION`, its fills charged by :func:`charge_fill`);
a remove or rename calls :func:`charge` / :func:`move` in its own SERIALIZABLE
transaction, so two writes that change one quota's use conflict and one runs
again: the use stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from ....errors import NotFound, QuotaExceeded
from ....protocol import paths
from ....protocol.quotas import Pin, Quota
from ..sqlite.db import layout_of
from ..sqlite.quotas import QuotaRow, exceeded, over_limit, path_of_names

_COLS = "q.dir_id, q.max_bytes, q.max_files, q.used_bytes, q.used_files"
_ABOVE = ("WITH RECURSIVE up(id) AS (SELECT $1::bigint UNION SELECT e.parent FROM entries e "
          "JOIN up ON e.id = up.id WHERE e.parent <> 0) "
          f"SELECT {_COLS} FROM quotas q JOIN up ON q.dir_id = up.id")
# The bytes a file's row ``e`` counts for: its size, or for a file of an attached
# directory its filled chunks' bytes (as .sqlite.quotas).
_FILLED = ("(SELECT COALESCE(SUM(c.size), 0) FROM cache_chunks c "
           "WHERE c.file_id = e.file_id AND c.crc IS NOT NULL)")
_CHARGED = (f"CASE WHEN (e.layout::jsonb ->> 'cached')::boolean THEN {_FILLED} "
            "ELSE e.size END")
_SUBTREE = ("WITH RECURSIVE sub(id) AS (SELECT $1::bigint UNION ALL "
            "SELECT e.id FROM entries e JOIN sub ON e.parent = sub.id) "
            f"SELECT COALESCE(SUM({_CHARGED}), 0)::bigint, COUNT(*) FROM entries e "
            "WHERE e.id IN (SELECT id FROM sub) AND e.kind = 'file'")
_PATH = ("WITH RECURSIVE up(id, parent, name, depth) AS ("
         "SELECT id, parent, name, 0 FROM entries WHERE id = $1 UNION ALL "
         "SELECT e.id, e.parent, e.name, up.depth + 1 FROM entries e "
         "JOIN up ON e.id = up.parent) SELECT name FROM up ORDER BY depth DESC")


async def above(conn: asyncpg.Connection, dir_id: int) -> list[QuotaRow]:
    return [tuple(r) for r in await conn.fetch(_ABOVE, dir_id)]  # type: ignore[misc]


async def totals(conn: asyncpg.Connection, entry_id: int) -> tuple[int, int]:
    """(bytes, files) of the file or the subtree at row ``entry_id``."""
    row = await conn.fetchrow(_SUBTREE, entry_id)
    return int(row[0]), int(row[1])


async def charged(conn: asyncpg.Connection, row: asyncpg.Record) -> int:
    """The bytes the file of entries row ``row`` counts for (``_CHARGED``)."""
    if not layout_of(row["layout"]).cached:
        return int(row["size"])
    return int(await conn.fetchval("SELECT " + _FILLED.replace("e.file_id", "$1"),
                                   row["file_id"]))


async def refund_chunks(conn: asyncpg.Connection, where: str, *args: object) -> None:
    """Before the chunk rows ``c`` that match ``where`` are deleted: their filled bytes
    leave the quotas above their files (as :meth:`.sqlite.quotas.QuotaSQL.refund_chunks`)."""
    if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM quotas)"):
        return
    rows = await conn.fetch(
        "SELECT e.parent, SUM(c.size)::bigint FROM cache_chunks c JOIN entries e "
        "ON e.file_id = c.file_id AND e.kind = 'file' "
        "AND (e.layout::jsonb ->> 'cached')::boolean "
        f"WHERE c.crc IS NOT NULL AND ({where}) GROUP BY e.parent", *args)
    for r in rows:
        await charge(conn, int(r[0]), -int(r[1]), 0, path="")   # a refund is never refused


async def charge_fill(conn: asyncpg.Connection, file_id: str, index: int, size: int,
                      path: str) -> None:
    """A fill's bytes join the use of the quotas above its file (less a filled row's it
    replaces); QuotaExceeded, before any change, where that passes one."""
    if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM quotas)"):
        return      # a fill pays one look when no quota is set
    parent = await conn.fetchval("SELECT parent FROM entries WHERE file_id = $1 AND kind = "
                                 "'file' AND (layout::jsonb ->> 'cached')::boolean", file_id)
    if parent is None:
        return      # removed meanwhile (counts nowhere), or written (counts its size)
    old = await conn.fetchval("SELECT size FROM cache_chunks WHERE file_id = $1 AND "
                              "idx = $2 AND crc IS NOT NULL", file_id, index)
    await charge(conn, int(parent), size - int(old or 0), 0, path=path)


async def dir_path(conn: asyncpg.Connection, dir_id: int) -> str:
    return path_of_names([r[0] for r in await conn.fetch(_PATH, dir_id)])


async def charge(conn: asyncpg.Connection, dir_id: int, d_bytes: int, d_files: int, *,
                 path: str) -> None:
    """Add to the use of every quota on directory ``dir_id`` or above it; raise
    QuotaExceeded (for the write at ``path``) when that passes a limit."""
    if d_bytes or d_files:
        await _apply(conn, await above(conn, dir_id), d_bytes, d_files, path)


def on_walk(rows: Sequence[asyncpg.Record]) -> list[QuotaRow]:
    """The quotas of the directories of a walk with quotas (``_WALK_QUOTAS`` of
    :mod:`.postgres.namespace`)."""
    return [(r["quota"], r["max_bytes"], r["max_files"], r["used_bytes"], r["used_files"])
            for r in rows if r["quota"] is not None]


async def move(conn: asyncpg.Connection, src: Sequence[QuotaRow], dst: Sequence[QuotaRow],
               entry_id: int, replaced: tuple[int, int], *, path: str) -> None:
    """A rename: the file or subtree at row ``entry_id`` moves from below the quotas
    ``src`` to below the quotas ``dst``, replacing a file of ``replaced`` (bytes,
    files) there.  The quotas above only one of them lose or gain the subtree; those
    above both lose only the replaced file; no round trip when none is involved."""
    src_ids, dst_ids = {r[0] for r in src}, {r[0] for r in dst}
    moved = (0, 0) if src_ids == dst_ids else await totals(conn, entry_id)
    for rows, d_bytes, d_files in (
            ([r for r in src if r[0] not in dst_ids], -moved[0], -moved[1]),
            ([r for r in dst if r[0] in src_ids], -replaced[0], -replaced[1]),
            ([r for r in dst if r[0] not in src_ids], moved[0] - replaced[0],
             moved[1] - replaced[1])):
        if d_bytes or d_files:
            await _apply(conn, rows, d_bytes, d_files, path)


async def _apply(conn: asyncpg.Connection, rows: Sequence[QuotaRow], d_bytes: int,
                 d_files: int, path: str) -> None:
    if not rows:
        return
    refused = over_limit(rows, d_bytes, d_files)
    if refused is not None:
        row, resource = refused
        limit, use, need = ((row[1], row[3], d_bytes) if resource == "bytes"
                            else (row[2], row[4], d_files))
        assert limit is not None
        raise exceeded(path, await dir_path(conn, row[0]), resource, limit, use, need)
    await conn.execute(
        "UPDATE quotas SET used_bytes = used_bytes + $1, used_files = used_files + $2 "
        "WHERE dir_id = ANY($3::bigint[])", d_bytes, d_files, [r[0] for r in rows])


async def commit_refused(conn: asyncpg.Connection, row: asyncpg.Record) -> QuotaExceeded:
    """The error of a commit ``stager_commit`` refused for a quota (``r_err``
    ``quota_bytes`` or ``quota_files``)."""
    return exceeded(row["r_path"], await dir_path(conn, int(row["r_at"])),
                    row["r_err"].removeprefix("quota_"), row["r_limit"], row["r_use"],
                    row["r_need"])


# -- the Quotas role ---------------------------------------------------------------------
async def set_quota(conn: asyncpg.Connection, dir_id: int, path: str, max_bytes: int | None,
                    max_files: int | None) -> Quota:
    used_bytes, used_files = await totals(conn, dir_id)
    if max_bytes is None and max_files is None:
        await conn.execute("DELETE FROM quotas WHERE dir_id = $1", dir_id)
    else:
        await conn.execute(
            "INSERT INTO quotas VALUES ($1, $2, $3, $4, $5) ON CONFLICT (dir_id) DO UPDATE "
            "SET max_bytes = EXCLUDED.max_bytes, max_files = EXCLUDED.max_files, "
            "used_bytes = EXCLUDED.used_bytes, used_files = EXCLUDED.used_files",
            dir_id, max_bytes, max_files, used_bytes, used_files)
    return Quota(path, max_bytes, max_files, used_bytes, used_files)


async def list_quotas(conn: asyncpg.Connection) -> list[Quota]:
    rows = await conn.fetch(f"SELECT {_COLS} FROM quotas q")
    found = [Quota(await dir_path(conn, r[0]), *tuple(r)[1:]) for r in rows]
    return sorted(found, key=lambda q: q.path)


# -- the Pins role -------------------------------------------------------------------------
async def pin(conn: asyncpg.Connection, path: str, expires: float | None, now: float) -> Pin:
    await conn.execute(
        "INSERT INTO pins VALUES ($1, $2, $3) ON CONFLICT (path) DO UPDATE "
        "SET expires = EXCLUDED.expires, created = EXCLUDED.created", path, expires, now)
    return Pin(path, expires, now)


async def unpin(conn: asyncpg.Connection, path: str) -> None:
    path = paths.normalize(path)
    if await conn.execute("DELETE FROM pins WHERE path = $1", path) != "DELETE 1":
        raise NotFound(f"{path} is not pinned", path=path)


async def pins(conn: asyncpg.Connection, now: float) -> list[Pin]:
    await conn.execute("DELETE FROM pins WHERE expires IS NOT NULL AND expires <= $1", now)
    rows = await conn.fetch("SELECT path, expires, created FROM pins ORDER BY path")
    return [Pin(r[0], r[1], r[2]) for r in rows]
