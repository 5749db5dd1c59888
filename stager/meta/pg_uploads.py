"""The PostgreSQL store's SQL of writes: uploads, their commits (one at a time and
in batches), and the garbage they leave.

Coroutines over one connection inside the caller's transaction.  A commit walks
the file's whole path in one statement (its parents and whatever is already
there), so it takes a handful of round trips however deep the file lies.  A
batch is one transaction whose items each run in a savepoint, so a failed item
leaves nothing behind and the others still commit.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from ..errors import NotADirectory, NotFound, StagerError, UploadNotFound
from ..protocol import paths
from ..protocol.models import Layout, LayoutSpec
from .pg_namespace import BUMP, UP, changed_below, garbage_file, inherited, located, mkdirs, walk
from .sqlite_batch import for_path
from .sqlite_db import layout_of, layout_text, pack
from .sqlite_namespace import check_replaceable
from .store import CommitArgs, CreateCheck, Garbage, NodeEntry, Upload

_UPLOAD_COLS = "file_id, path, layout, overwrite, parents, created"


def _upload(row: asyncpg.Record) -> Upload:
    return Upload(row["file_id"], row["path"], layout_of(row["layout"]), row["overwrite"],
                  row["parents"], row["created"])


def _missing(file_id: str) -> UploadNotFound:
    return UploadNotFound(f"no pending upload {file_id}", file_id=file_id)


async def begin_uploads(conn: asyncpg.Connection, uploads: Sequence[Upload]) -> None:
    await conn.executemany(f"INSERT INTO uploads ({_UPLOAD_COLS}) VALUES ($1, $2, $3, $4, $5, $6)",
                           [(u.file_id, u.path, layout_text(u.layout), u.overwrite, u.parents,
                             u.created) for u in uploads])


async def get_upload(conn: asyncpg.Connection, file_id: str) -> Upload:
    row = await conn.fetchrow(f"SELECT {_UPLOAD_COLS} FROM uploads WHERE file_id = $1",
                              file_id)
    if row is None:
        raise _missing(file_id)
    return _upload(row)


# The file, its directory touched, and the manifests on it and above it bumped: one
# statement.  In a batch the bump waits for the end: one for all its directories.
_INSERT = ("INSERT INTO entries (parent, name, kind, size, mtime, file_id, layout, checksums)"
           " VALUES (($1::bigint[])[1], $2, 'file', $3, $4, $5, $6, $7)")
_TOUCH = "touched AS (UPDATE entries SET mtime = $8 WHERE id = ($1::bigint[])[1])"
_COMMIT_ALONE = f"WITH RECURSIVE {UP}, {_TOUCH}, bumped AS ({BUMP}) {_INSERT}"
_COMMIT_IN_BATCH = f"WITH {_TOUCH} {_INSERT}"


async def commit_upload(conn: asyncpg.Connection, file_id: str, *, size: int,
                        checksums: tuple[int, ...], mtime: float, now: float,
                        changed: set[int] | None = None) -> NodeEntry:
    """``changed``: where a batch collects the directories to bump at its end."""
    # Taken off the pending uploads first; if anything below fails, the transaction
    # (or the item's savepoint) rolls back and the upload is pending again.
    row = await conn.fetchrow(
        f"DELETE FROM uploads WHERE file_id = $1 RETURNING {_UPLOAD_COLS}", file_id)
    if row is None:
        raise _missing(file_id)
    upload = _upload(row)
    parent, name = paths.split(upload.path)
    names = paths.parts(upload.path)
    rows = await walk(conn, names)
    parent_id = await mkdirs(conn, parent, rows, parents=upload.parents, exist_ok=True,
                             now=now)
    existing = rows[-1] if len(rows) == len(names) + 1 else None
    check_replaceable(None if existing is None else (existing["id"], existing["kind"]),
                      upload.path, upload.overwrite)
    if existing is not None:
        await garbage_file(conn, existing, now)
        await conn.execute("DELETE FROM entries WHERE id = $1", existing["id"])
    if changed is not None:
        changed.add(parent_id)
    await conn.execute(_COMMIT_ALONE if changed is None else _COMMIT_IN_BATCH,
                       [parent_id], name, size, mtime, file_id, layout_text(upload.layout),
                       pack(checksums), now)
    return NodeEntry(upload.path, "file", size, mtime, file_id, upload.layout,
                     checksums=checksums)


async def abort_upload(conn: asyncpg.Connection, file_id: str, *, now: float) -> None:
    row = await conn.fetchrow("DELETE FROM uploads WHERE file_id = $1 RETURNING layout",
                              file_id)
    if row is None:
        raise _missing(file_id)
    await conn.execute(
        "INSERT INTO garbage VALUES ($1, $2, 0, $3) ON CONFLICT (file_id) DO UPDATE "
        "SET layout = EXCLUDED.layout, size = EXCLUDED.size, since = EXCLUDED.since",
        file_id, row["layout"], now)


async def replace_upload_layout(conn: asyncpg.Connection, file_id: str, old: Layout,
                                new: Layout) -> bool:
    status = await conn.execute(
        "UPDATE uploads SET layout = $1 WHERE file_id = $2 AND layout = $3",
        layout_text(new), file_id, layout_text(old))
    return bool(status == "UPDATE 1")


async def expired_uploads(conn: asyncpg.Connection, before: float) -> list[Upload]:
    rows = await conn.fetch(
        f"SELECT {_UPLOAD_COLS} FROM uploads WHERE created < $1 ORDER BY created", before)
    return [_upload(r) for r in rows]


async def take_garbage(conn: asyncpg.Connection, limit: int) -> list[Garbage]:
    rows = await conn.fetch(
        "SELECT file_id, layout, size, since FROM garbage ORDER BY since LIMIT $1", limit)
    return [Garbage(r[0], layout_of(r[1]), r[2], r[3]) for r in rows]


async def drop_garbage(conn: asyncpg.Connection, file_ids: list[str]) -> None:
    await conn.execute("DELETE FROM garbage WHERE file_id = ANY($1::text[])", file_ids)


# -- batches ------------------------------------------------------------------------------
async def check_creates(conn: asyncpg.Connection, items: Sequence[CreateCheck]
                        ) -> list[LayoutSpec | StagerError]:
    """In one snapshot: the walk of each parent once, then its children the batch
    names, in one query per parent."""
    states: dict[str, tuple[int | None, LayoutSpec] | StagerError] = {}
    taken: dict[str, dict[str, asyncpg.Record]] = {}
    for path, _, _ in items:
        parent, name = paths.split(path)
        if parent not in states:
            states[parent] = await _parent_state(conn, parent)
            taken[parent] = {}
            state = states[parent]
            if not isinstance(state, StagerError) and state[0] is not None:
                names = sorted({paths.split(p)[1] for p, _, _ in items
                                if paths.split(p)[0] == parent})
                rows = await conn.fetch("SELECT name, id, kind FROM entries "
                                        "WHERE parent = $1 AND name = ANY($2::text[])",
                                        state[0], names)
                taken[parent] = {r["name"]: r for r in rows}
    out: list[LayoutSpec | StagerError] = []
    for path, overwrite, make_parents in items:
        parent, name = paths.split(path)
        state = states[parent]
        try:
            if isinstance(state, StagerError):
                raise state
            parent_id, spec = state
            if parent_id is None:
                if not make_parents:
                    raise NotFound(f"parent directory {parent} does not exist", path=path)
            else:
                found = taken[parent].get(name)
                check_replaceable(None if found is None else (found["id"], found["kind"]),
                                  path, overwrite)
        except StagerError as exc:
            out.append(for_path(exc, path))
            continue
        out.append(spec)
    return out


async def _parent_state(conn: asyncpg.Connection, parent: str
                        ) -> tuple[int | None, LayoutSpec] | StagerError:
    """(the parent directory's id or None when it is missing, the layout its new files
    inherit), or the error every file in it gets."""
    names = paths.parts(parent)
    rows = await walk(conn, names)
    try:
        row = located(parent, names, rows)
    except NotFound:
        return None, inherited(rows)
    except NotADirectory as exc:
        return exc
    if row["kind"] != "directory":
        return NotADirectory(f"{parent} is not a directory", path=parent)
    return int(row["id"]), inherited(rows)


async def get_uploads(conn: asyncpg.Connection, file_ids: Sequence[str]
                      ) -> list[Upload | StagerError]:
    rows = await conn.fetch(
        f"SELECT {_UPLOAD_COLS} FROM uploads WHERE file_id = ANY($1::text[])", list(file_ids))
    found = {r["file_id"]: _upload(r) for r in rows}
    return [found[f] if f in found else _missing(f) for f in file_ids]


async def commit_uploads(conn: asyncpg.Connection, items: Sequence[CommitArgs], *,
                         now: float) -> list[NodeEntry | StagerError]:
    out: list[NodeEntry | StagerError] = []
    changed: set[int] = set()
    for file_id, size, checksums, mtime in items:
        try:
            async with conn.transaction():          # a savepoint: the item fails alone
                out.append(await commit_upload(conn, file_id, size=size,
                                               checksums=checksums, mtime=mtime, now=now,
                                               changed=changed))
        except StagerError as exc:
            out.append(exc)
    if changed:
        await changed_below(conn, list(changed))
    return out


async def abort_uploads(conn: asyncpg.Connection, file_ids: Sequence[str], *, now: float
                        ) -> list[StagerError | None]:
    out: list[StagerError | None] = []
    for file_id in file_ids:
        try:
            async with conn.transaction():
                await abort_upload(conn, file_id, now=now)
            out.append(None)
        except StagerError as exc:
            out.append(exc)
    return out
