"""The PostgreSQL store's SQL of writes: uploads, their commits, and the garbage
they leave.

Coroutines over one connection inside the caller's transaction.  Every write takes
a batch; a batch is one transaction whose items each fail alone, leaving nothing
behind, while the others still commit.  A commit is one statement, a server-side
function (:mod:`.postgres.functions`), however deep the file lies, so a batch of one
is one statement (with its manifests bumped in it); checking a batch of one create
is one statement too (the walk of its whole path), and so is beginning one upload.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import asyncpg

from ....errors import (
    AlreadyExists,
    IsADirectory,
    NotADirectory,
    NotFound,
    QuotaExceeded,
    StagerError,
    UploadNotFound,
)
from ....protocol import paths
from ....protocol.models import Layout, LayoutSpec, attrs_text
from ..base import CommitArgs, CreateCheck, Garbage, NodeEntry, Upload, committing
from ..spec import SpecChanged, checked_create, checked_spec
from ..sqlite.db import layout_of, layout_text, pack
from . import quotas
from .db import ROOT_ID, must_abort
from .namespace import changed_files, inherited, located, walk

_UPLOAD_COLS = "file_id, path, layout, overwrite, parents, created"


def _upload(row: asyncpg.Record) -> Upload:
    return Upload(row["file_id"], row["path"], layout_of(row["layout"]), row["overwrite"],
                  row["parents"], row["created"])


def _missing(file_id: str) -> UploadNotFound:
    return UploadNotFound(f"no pending upload {file_id}", file_id=file_id)


async def begin_uploads(conn: asyncpg.Connection, uploads: Sequence[Upload]) -> None:
    await _check_planned(conn, uploads)
    await conn.executemany(f"INSERT INTO uploads ({_UPLOAD_COLS}) VALUES ($1, $2, $3, $4, $5, $6)",
                           [(u.file_id, u.path, layout_text(u.layout), u.overwrite, u.parents,
                             u.created) for u in uploads])


async def reserve(conn: asyncpg.Connection, upload: Upload) -> None:
    """:func:`begin_uploads` of one, as a statement that may run again (after a lost
    connection, its first run may have committed): finding its own row is done.  Its
    commit does not wait for the WAL flush (``stager_reserve``, :mod:`.postgres.functions`
    says why that loses nothing promised)."""
    await _check_planned(conn, [upload])
    values = (upload.file_id, upload.path, layout_text(upload.layout), upload.overwrite,
              upload.parents, upload.created)
    if await conn.fetchval("SELECT stager_reserve($1, $2, $3, $4, $5, $6)", *values):
        return
    row = await conn.fetchrow(f"SELECT {_UPLOAD_COLS} FROM uploads WHERE file_id = $1",
                              upload.file_id)
    if row is None or tuple(row) != values:     # another upload's: the error it was
        await begin_uploads(conn, [upload])


# A commit alone, as one statement: stager_commit, and the gen of every manifest on a
# directory the file's path walks through (the ones already there: a directory the
# commit makes has none) bumped alongside.  A commit that fails may still bump them,
# which only costs a manifest cache a resolution it did not need.
_COMMIT_BUMPING = f"""
WITH RECURSIVE target AS (
    SELECT string_to_array(substr(path, 2), '/') AS names FROM uploads WHERE file_id = $1
), dirs AS (
    SELECT 0 AS depth, e.id, e.kind FROM entries e, target WHERE e.id = {ROOT_ID}
  UNION ALL
    SELECT d.depth + 1, e.id, e.kind FROM dirs d CROSS JOIN target t
    JOIN entries e ON e.parent = d.id AND e.name = t.names[d.depth + 1]
    WHERE d.kind = 'directory' AND d.depth < cardinality(t.names) - 1
), bumped AS (
    UPDATE manifests SET gen = gen + 1 WHERE dir_id IN (SELECT id FROM dirs)
)
SELECT * FROM stager_commit($1, $2, $3, $4, $5, $6)"""
_COMMIT = "SELECT * FROM stager_commit($1, $2, $3, $4, $5, $6)"


async def _commit(conn: asyncpg.Connection, item: CommitArgs, now: float, *,
                  bump: bool) -> NodeEntry | StagerError:
    """One statement (:data:`.functions.COMMIT_FUNCTION`); the error it answers comes
    after it changed nothing but manifest versions (the upload stays pending).
    ``bump=False``: a batch bumps the manifests of all its files at its end."""
    file_id, size, checksums, mtime, attrs = committing(item)
    row = await conn.fetchrow(_COMMIT_BUMPING if bump else _COMMIT,
                              file_id, size, mtime, pack(checksums), now, attrs_text(attrs))
    return await _committed(conn, item, row, now)


# An upload begun and committed as one statement (``stager_put``, schema 16; since 17
# without the upload's row where the commit succeeds), bumping the manifests above its
# path itself: the walk of _COMMIT_BUMPING would start from that row.
# Since schema 18 it also checks the directory layout a put planned without the check
# of its path assumed (``Upload.spec``).
_PUT = "SELECT * FROM stager_put($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"


async def put(conn: asyncpg.Connection, upload: Upload, item: CommitArgs, now: float
              ) -> NodeEntry | StagerError:
    """:func:`begin_uploads` of ``upload`` and its commit ``item``, as one statement: a
    durable one (unlike :func:`reserve`), answering as the commit would; a commit that
    fails leaves the upload pending, as it would."""
    file_id, size, checksums, mtime, attrs = committing(item)
    assert file_id == upload.file_id
    spec = None if upload.spec is None else json.dumps(upload.spec.to_json())
    row = await conn.fetchrow(
        _PUT, file_id, upload.path, layout_text(upload.layout), upload.overwrite,
        upload.parents, upload.created, size, mtime, pack(checksums), now, attrs_text(attrs),
        spec)
    if row["r_err"] == "spec":          # changed nothing: planned again, written again
        return SpecChanged(upload.path, LayoutSpec.from_json(json.loads(row["r_layout"])))
    out = await _committed(conn, item, row, now)
    if spec is not None and isinstance(out, StagerError) and not isinstance(out, QuotaExceeded):
        # refused where the check it skipped would have refused it: that check's error
        # (its words and codes), from one more statement on this rare path
        found = await check_create(conn, (upload.path, upload.overwrite, upload.parents))
        if isinstance(found, StagerError):
            return found
    return out


async def _check_planned(conn: asyncpg.Connection, uploads: Sequence[Upload]) -> None:
    """Uploads planned without a check (``spec`` set) and recorded alone, not joined to
    their commit (a reroute, an abort): their check, before the record."""
    for upload in uploads:
        if upload.spec is not None:
            refused = checked_spec(upload, await check_create(
                conn, (upload.path, upload.overwrite, upload.parents)))
            if refused is not None:
                raise refused


async def _committed(conn: asyncpg.Connection, item: CommitArgs, row: asyncpg.Record,
                     now: float) -> NodeEntry | StagerError:
    """The entry a commit's row of ``stager_commit`` names, or its error."""
    file_id, size, checksums, mtime, attrs = committing(item)
    if row["r_err"] is not None:
        if row["r_err"].startswith("quota_"):       # final: its chunks are collected
            async with conn.transaction():  # (a commit alone ran outside of one)
                await _abort(conn, file_id, now)
            return await quotas.commit_refused(conn, row)
        return _commit_error(file_id, row["r_err"], row["r_at"], row["r_path"])
    return NodeEntry(row["r_path"], "file", size, mtime, file_id, layout_of(row["r_layout"]),
                     checksums=checksums, attrs=attrs)


def _commit_error(file_id: str, code: str, at: str | None, path: str | None) -> StagerError:
    """The error ``stager_commit`` answered with, as the Python steps raised it."""
    if code == "upload" or path is None:
        return _missing(file_id)
    parent = paths.split(path)[0]
    if code == "noparent":
        return NotFound(f"parent directory {at} does not exist", path=parent)
    if code == "fileparent":
        return AlreadyExists(f"{at} exists and is a file", path=parent)
    if code == "notdir":
        return NotADirectory(f"{at} is not a directory", path=parent)
    if code == "isdir":
        return IsADirectory(f"{path} is a directory", path=path)
    return AlreadyExists(f"{path} already exists", path=path)


async def _abort(conn: asyncpg.Connection, file_id: str, now: float) -> StagerError | None:
    row = await conn.fetchrow("DELETE FROM uploads WHERE file_id = $1 RETURNING layout",
                              file_id)
    if row is None:
        return _missing(file_id)        # changed nothing
    await conn.execute(
        "INSERT INTO garbage VALUES ($1, $2, 0, $3) ON CONFLICT (file_id) DO UPDATE "
        "SET layout = EXCLUDED.layout, size = EXCLUDED.size, since = EXCLUDED.since",
        file_id, row["layout"], now)
    return None


async def replace_upload_layout(conn: asyncpg.Connection, file_id: str, old: Layout,
                                new: Layout) -> bool:
    status = await conn.execute(
        "UPDATE uploads SET layout = $1 WHERE file_id = $2 AND layout = $3",
        layout_text(new), file_id, layout_text(old))
    return bool(status == "UPDATE 1")


async def expired_uploads(conn: asyncpg.Connection, before: float) -> list[Upload]:
    # a multipart upload's pending file lives by its record's idle limit (multipart.py)
    rows = await conn.fetch(
        f"SELECT {_UPLOAD_COLS} FROM uploads WHERE created < $1" + (
            "" if before == float("inf") else
            " AND file_id NOT IN (SELECT file_id FROM multipart_uploads)")
        + " ORDER BY created", before)
    return [_upload(r) for r in rows]


async def take_garbage(conn: asyncpg.Connection, limit: int) -> list[Garbage]:
    rows = await conn.fetch(
        "SELECT file_id, layout, size, since FROM garbage ORDER BY since LIMIT $1", limit)
    return [Garbage(r[0], layout_of(r[1]), r[2], r[3]) for r in rows]


async def drop_garbage(conn: asyncpg.Connection, file_ids: list[str], now: float,
                       forget_before: float) -> None:
    await conn.execute("DELETE FROM purged WHERE at < $1", forget_before)
    await conn.execute(
        "WITH gone AS (DELETE FROM garbage WHERE file_id = ANY($1::text[]) RETURNING file_id) "
        "INSERT INTO purged SELECT file_id, $2 FROM gone "
        "ON CONFLICT (file_id) DO UPDATE SET at = EXCLUDED.at", file_ids, now)


async def retired(conn: asyncpg.Connection, file_id: str) -> bool:
    return bool(await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM garbage WHERE file_id = $1) "
        "OR EXISTS (SELECT 1 FROM purged WHERE file_id = $1)", file_id))


# -- batches ------------------------------------------------------------------------------
async def check_creates(conn: asyncpg.Connection, items: Sequence[CreateCheck]
                        ) -> list[LayoutSpec | StagerError]:
    """In one snapshot: the walk of each parent once, then its children the batch
    names, in one query per parent."""
    states: dict[str, tuple[int | None, LayoutSpec] | StagerError] = {}
    taken: dict[int, dict[str, tuple[int, str]]] = {}      # parent id: name: (id, kind)
    for path, _, _ in items:
        parent = paths.split(path)[0]
        if parent not in states:
            states[parent] = _parent_state(parent, await walk(conn, paths.parts(parent),
                                                               kinds=True))
            state = states[parent]
            if not isinstance(state, StagerError) and state[0] is not None:
                names = sorted({paths.split(p)[1] for p, _, _ in items
                                if paths.split(p)[0] == parent})
                rows = await conn.fetch("SELECT name, id, kind FROM entries "
                                        "WHERE parent = $1 AND name = ANY($2::text[])",
                                        state[0], names)
                taken[state[0]] = {r["name"]: (r["id"], r["kind"]) for r in rows}
    return [checked_create(item, states[paths.split(item[0])[0]],
                           lambda parent_id, name: taken[parent_id].get(name))
            for item in items]


async def check_create(conn: asyncpg.Connection, item: CreateCheck) -> LayoutSpec | StagerError:
    """:func:`check_creates` of one item in one statement: the walk of its whole path
    gives its parent's state and what is already there."""
    path = item[0]
    names = paths.parts(path)
    rows = await walk(conn, names, kinds=True)
    parent = paths.split(path)[0]
    state = _parent_state(parent, rows[:len(names)])
    found = rows[-1] if len(rows) == len(names) + 1 else None
    taken = {} if found is None else {names[-1]: (found["id"], found["kind"])}
    return checked_create(item, state, lambda _parent, name: taken.get(name))


def _parent_state(parent: str, rows: Sequence[asyncpg.Record]
                  ) -> tuple[int | None, LayoutSpec] | StagerError:
    """(the parent directory's id or None when it is missing, the layout its new files
    inherit), or the error every file in it gets; ``rows`` is the parent's walk."""
    names = paths.parts(parent)
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
    """Each item's commit statement, then one statement bumping the manifests above all
    the files committed; a batch of one is its one statement, bumping them itself."""
    if len(items) == 1:
        return [await _commit(conn, items[0], now, bump=True)]
    out = await _commit_each(conn, items, now)
    done = [e.file_id for e in out if isinstance(e, NodeEntry) and e.file_id]
    if done:
        await changed_files(conn, done)
    return out


async def _commit_each(conn: asyncpg.Connection, items: Sequence[CommitArgs], now: float
                       ) -> list[NodeEntry | StagerError]:
    """Each item fails alone.  A commit that fails with our error has changed nothing,
    so the items run one after the other in one savepoint; only a database error
    (which aborts the savepoint) has them run again, each in a savepoint of its own."""
    try:
        async with conn.transaction():
            return [await _commit(conn, item, now, bump=False) for item in items]
    except Exception as exc:
        if must_abort(exc, conn):
            raise
    out: list[NodeEntry | StagerError] = []
    for item in items:
        async with conn.transaction():          # a savepoint: the item fails alone
            out.append(await _commit(conn, item, now, bump=False))
    return out


async def abort_uploads(conn: asyncpg.Connection, file_ids: Sequence[str], *, now: float
                        ) -> list[StagerError | None]:
    """Each item's error changed nothing, so no savepoint is needed for it (a database
    error aborts the whole transaction, which is run again)."""
    return [await _abort(conn, file_id, now) for file_id in file_ids]
