"""The PostgreSQL store's SQL of quotas and pins (as :mod:`.sqlite.quotas`, whose check
and error it shares).

A commit charges the quotas above its file inside ``stager_commit``
(:data:`.functions.QUOTA_COMMIT_FUNCTION`); a remove or rename calls :func:`charge` /
:func:`move` in its own SERIALIZABLE transaction, so two writes that change one
quota's use conflict and one runs again: the use stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from ....errors import NotFound, QuotaExceeded
from ....protocol import paths
from ....protocol.quotas import Pin, Quota
from ..sqlite.quotas import QuotaRow, exceeded, over_limit, path_of_names

_COLS = "q.dir_id, q.max_bytes, q.max_files, q.used_bytes, q.used_files"
_ABOVE = ("WITH RECURSIVE up(id) AS (SELECT $1::bigint UNION SELECT e.parent FROM entries e "
          "JOIN up ON e.id = up.id WHERE e.parent <> 0) "
          f"SELECT {_COLS} FROM quotas q JOIN up ON q.dir_id = up.id")
_SUBTREE = ("WITH RECURSIVE sub(id) AS (SELECT $1::bigint UNION ALL "
            "SELECT e.id FROM entries e JOIN sub ON e.parent = sub.id) "
            "SELECT COALESCE(SUM(size), 0)::bigint, COUNT(*) FROM entries "
            "WHERE id IN (SELECT id FROM sub) AND kind = 'file'")
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
