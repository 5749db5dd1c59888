"""The PostgreSQL store's SQL of committed files by id (rebuild, repair, fsck), of
minted tokens, and of the target registry.

Files are found by id (an index on ``entries.file_id``) and by the targets their
layout names (the stored layout read as ``jsonb``).  A layout is replaced by
compare-and-swap on its stored text, one encoding everywhere
(:func:`~.sqlite.db.layout_text`), so a rebuild never overwrites a newer layout
and never resurrects a file deleted while its chunks were being copied.
"""

from __future__ import annotations

import asyncpg

from ....errors import NotFound
from ....protocol.authmsg import TokenInfo
from ....protocol.models import Layout, TargetInfo
from ..base import StoredFile
from ..sqlite.db import layout_of, layout_text, unpack
from .namespace import changed_below

_FILE_COLS = "id, file_id, size, layout, checksums"
_TOKEN_COLS = "id, name, scopes, prefixes, created, expires, revoked, uses"
_TARGET_COLS = "id, node, url, capacity, used, chunks, last_heartbeat, state"


def _stored(row: asyncpg.Record) -> StoredFile:
    return StoredFile(row=int(row["id"]), file_id=str(row["file_id"]), size=int(row["size"]),
                      layout=layout_of(row["layout"]), checksums=unpack(row["checksums"]))


# -- committed files ---------------------------------------------------------------------
async def file_by_id(conn: asyncpg.Connection, file_id: str) -> StoredFile | None:
    row = await conn.fetchrow(
        f"SELECT {_FILE_COLS} FROM entries WHERE file_id = $1 AND kind = 'file'", file_id)
    return _stored(row) if row is not None else None


async def path_of_file(conn: asyncpg.Connection, file_id: str) -> str | None:
    rows = await conn.fetch(
        "WITH RECURSIVE up(id, parent, name, depth) AS ("
        " SELECT id, parent, name, 0 FROM entries WHERE file_id = $1 AND kind = 'file'"
        " UNION ALL SELECT e.id, e.parent, e.name, up.depth + 1"
        " FROM entries e JOIN up ON e.id = up.parent)"
        " SELECT name FROM up ORDER BY depth DESC", file_id)
    if not rows:
        return None
    return "/" + "/".join(r[0] for r in rows if r[0])


async def files_page(conn: asyncpg.Connection, *, after: int, limit: int,
                     targets: frozenset[str] | None) -> list[StoredFile]:
    if targets is None:
        rows = await conn.fetch(
            f"SELECT {_FILE_COLS} FROM entries WHERE kind = 'file' AND id > $1 "
            "ORDER BY id LIMIT $2", after, limit)
        return [_stored(r) for r in rows]
    if not targets:
        return []
    rows = await conn.fetch(
        f"SELECT {_FILE_COLS} FROM entries WHERE kind = 'file' AND id > $1 "
        "AND (layout::jsonb -> 'targets') ?| $2::text[] ORDER BY id LIMIT $3",
        after, sorted(targets), limit)
    return [_stored(r) for r in rows]


async def replace_layout(conn: asyncpg.Connection, file_id: str, old: Layout,
                         new: Layout) -> bool:
    parent = await conn.fetchval(
        "UPDATE entries SET layout = $1 WHERE file_id = $2 AND kind = 'file' "
        "AND layout = $3 RETURNING parent", layout_text(new), file_id, layout_text(old))
    if parent is None:
        return False
    await changed_below(conn, [int(parent)])
    return True


# -- tokens ------------------------------------------------------------------------------
def _token(row: asyncpg.Record) -> TokenInfo:
    return TokenInfo(row["id"], row["name"], tuple(row["scopes"]), tuple(row["prefixes"]),
                     int(row["created"]), int(row["expires"]),
                     None if row["revoked"] is None else int(row["revoked"]),
                     None if row["uses"] is None else int(row["uses"]))


async def put_token(conn: asyncpg.Connection, info: TokenInfo) -> None:
    await conn.execute(
        f"INSERT INTO tokens ({_TOKEN_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        info.id, info.name, list(info.scopes), list(info.prefixes), info.created,
        info.expires, info.revoked, info.uses)


async def list_tokens(conn: asyncpg.Connection) -> list[TokenInfo]:
    rows = await conn.fetch(f"SELECT {_TOKEN_COLS} FROM tokens ORDER BY created, id")
    return [_token(r) for r in rows]


async def revoke_token(conn: asyncpg.Connection, token_id: str, now: int) -> TokenInfo:
    await conn.execute("UPDATE tokens SET revoked = $1 WHERE id = $2 AND revoked IS NULL",
                       now, token_id)
    row = await conn.fetchrow(f"SELECT {_TOKEN_COLS} FROM tokens WHERE id = $1", token_id)
    if row is None:
        raise NotFound(f"no token {token_id}", token=token_id)
    return _token(row)


async def take_token_use(conn: asyncpg.Connection, token_id: str) -> bool:
    uses = await conn.fetchrow("UPDATE tokens SET uses = uses - 1 WHERE id = $1 AND uses > 0 "
                               "RETURNING uses", token_id)
    if uses is not None:
        return True
    row = await conn.fetchrow("SELECT uses FROM tokens WHERE id = $1", token_id)
    return row is not None and row["uses"] is None


# -- target credentials --------------------------------------------------------------------
async def target_credential(conn: asyncpg.Connection, target_id: str) -> str | None:
    return await conn.fetchval(
        "SELECT token_id FROM target_credentials WHERE target_id = $1", target_id)


async def pin_target_credential(conn: asyncpg.Connection, target_id: str, token_id: str,
                                replaces: str | None) -> bool:
    if replaces is None:
        status = await conn.execute(
            "INSERT INTO target_credentials VALUES ($1, $2) ON CONFLICT DO NOTHING",
            target_id, token_id)
    else:
        status = await conn.execute(
            "UPDATE target_credentials SET token_id = $2 WHERE target_id = $1 "
            "AND token_id = $3", target_id, token_id, replaces)
    return bool(status.endswith(" 1"))


async def forget_target(conn: asyncpg.Connection, target_id: str) -> None:
    await conn.execute("DELETE FROM target_credentials WHERE target_id = $1", target_id)
    await conn.execute("DELETE FROM targets WHERE id = $1", target_id)


# -- targets -----------------------------------------------------------------------------
async def upsert_target(conn: asyncpg.Connection, t: TargetInfo) -> None:
    await conn.execute(
        f"INSERT INTO targets ({_TARGET_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) "
        "ON CONFLICT (id) DO UPDATE SET node = EXCLUDED.node, url = EXCLUDED.url, "
        "capacity = EXCLUDED.capacity, used = EXCLUDED.used, chunks = EXCLUDED.chunks, "
        "last_heartbeat = EXCLUDED.last_heartbeat, state = EXCLUDED.state",
        t.id, t.node, t.url, t.capacity, t.used, t.chunks, t.last_heartbeat, t.state)


async def list_targets(conn: asyncpg.Connection) -> list[TargetInfo]:
    rows = await conn.fetch(f"SELECT {_TARGET_COLS} FROM targets ORDER BY id")
    return [TargetInfo(id=r[0], node=r[1], url=r[2], capacity=r[3], used=r[4], chunks=r[5],
                       last_heartbeat=r[6], state=r[7]) for r in rows]
