"""The PostgreSQL store's SQL of the namespace and manifests.

Coroutines over one connection, called inside the transaction
:class:`~.postgres.db.Database` opens (see :class:`~.postgres.store.PostgreSQLStore`, whose
methods say what each guarantees).  A path is resolved in one statement: a
recursive query walks its components from the root along the ``(parent, name)``
index and returns every entry on the way, so a stat is one round trip and an
error names the component where the walk stopped, as the SQLite store's does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import asyncpg

from ....errors import (
    AlreadyExists,
    DirectoryNotEmpty,
    InvalidPath,
    IsADirectory,
    NotADirectory,
    NotFound,
)
from ....protocol import paths
from ....protocol.models import LayoutSpec
from ..base import Listed, ManifestVersion, NodeEntry
from ..sqlite.db import attrs_from, layout_of, subtree_entries, unpack
from ..sqlite.listing import LISTED, listed
from . import quotas
from .db import ROOT_ID

Row = asyncpg.Record
COLS = "id, kind, size, mtime, file_id, layout, checksums, attrs"
_SCAN = (f"SELECT {LISTED} FROM entries WHERE parent = $1 AND name > $2 "
         "ORDER BY name LIMIT $3")

_WALK_CTE = f"""
WITH RECURSIVE walk AS (
    SELECT 0 AS depth, {COLS} FROM entries WHERE id = {ROOT_ID}
  UNION ALL
    SELECT w.depth + 1, e.id, e.kind, e.size, e.mtime, e.file_id, e.layout, e.checksums,
           e.attrs
    FROM walk w JOIN entries e ON e.parent = w.id AND e.name = ($1::text[])[w.depth + 1]
    WHERE w.kind = 'directory' AND w.depth < cardinality($1::text[])
)"""
_WALK = _WALK_CTE + "SELECT * FROM walk ORDER BY depth"
# The walk a create's check takes: what a new file inherits and what stands in its way
# (id, kind, layout), not the checksums of a file it would replace (megabytes for a
# large one: 4 bytes a chunk).
_ALL_E = "e.id, e.kind, e.size, e.mtime, e.file_id, e.layout, e.checksums,\n           e.attrs"
assert _WALK_CTE.count(_ALL_E) == 1 and _WALK_CTE.count(COLS) == 1
_WALK_KINDS = (_WALK_CTE.replace(COLS, "id, kind, layout")
               .replace(_ALL_E, "e.id, e.kind, e.layout") + "SELECT * FROM walk ORDER BY depth")
# The walk with each directory's quota (NULL quota: none), for a rename: the quotas it
# moves use between come with the walks it takes anyway, no round trip of their own.
_WALK_QUOTAS = _WALK_CTE + (
    "SELECT w.*, q.dir_id AS quota, q.max_bytes, q.max_files, q.used_bytes, q.used_files "
    "FROM walk w LEFT JOIN quotas q ON q.dir_id = w.id ORDER BY depth")


def _bump_up_from(seed: str, changes: str = "") -> str:
    """A statement bumping the gen of every manifest on the directories ``seed``
    selects or on their ancestors: the walk up the parent chain (a few rows each),
    joined to the small manifests table; after the ``changes`` (data-modifying CTEs,
    each ending with a comma) it makes in the same statement."""
    return ("WITH RECURSIVE " + changes + "up(id) AS (" + seed + " UNION SELECT e.parent "
            "FROM entries e JOIN up ON e.id = up.id WHERE e.parent <> 0) "
            "UPDATE manifests SET gen = gen + 1 WHERE dir_id IN (SELECT id FROM up)")


_BUMP_DIRS = _bump_up_from("SELECT unnest($1::bigint[])")
_BUMP_FILES = _bump_up_from(
    "SELECT parent FROM entries WHERE file_id = ANY($1::text[]) AND kind = 'file'")


async def changed_below(conn: asyncpg.Connection, dir_ids: Sequence[int]) -> None:
    """In the caller's transaction: what a manifest on one of ``dir_ids`` or on one of
    their ancestors resolves to has changed; their ``gen`` goes up by one."""
    await conn.execute(_BUMP_DIRS, sorted(set(dir_ids)))


async def changed_files(conn: asyncpg.Connection, file_ids: Sequence[str]) -> None:
    """:func:`changed_below` the directories of the committed files ``file_ids``:
    one statement for a whole batch."""
    await conn.execute(_BUMP_FILES, list(file_ids))


async def walk(conn: asyncpg.Connection, names: Sequence[str], *,
               kinds: bool = False) -> list[Row]:
    """The entries along ``names`` from the root (the root first), as far as they go:
    up to a missing one, or to a file; with ``kinds``, only their id, kind and layout."""
    return list(await conn.fetch(_WALK_KINDS if kinds else _WALK, list(names)))


def located(path: str, names: Sequence[str], rows: Sequence[Row]) -> Row:
    """The entry at ``path`` from its walk; NotFound or NotADirectory where it stops."""
    if len(rows) == len(names) + 1:
        return rows[-1]
    depth = len(rows) - 1
    if rows[-1]["kind"] != "directory":
        raise NotADirectory(f"/{'/'.join(names[:depth])} is not a directory", path=path)
    raise NotFound(f"no such file or directory: /{'/'.join(names[:depth + 1])}", path=path)


async def resolve(conn: asyncpg.Connection, path: str) -> Row:
    names = paths.parts(path)
    return located(path, names, await walk(conn, names))


async def resolve_dir(conn: asyncpg.Connection, path: str) -> int:
    row = await resolve(conn, path)
    if row["kind"] != "directory":
        raise NotADirectory(f"{path} is not a directory", path=path)
    return int(row["id"])


async def child(conn: asyncpg.Connection, parent_id: int, name: str) -> Row | None:
    row: Row | None = await conn.fetchrow(
        f"SELECT {COLS} FROM entries WHERE parent = $1 AND name = $2", parent_id, name)
    return row


def entry(path: str, row: Row, checksums: bool) -> NodeEntry:
    if row["kind"] == "file":
        return NodeEntry(path, "file", row["size"], row["mtime"], row["file_id"],
                         layout=layout_of(row["layout"]),
                         checksums=unpack(row["checksums"]) if checksums else None,
                         attrs=attrs_from(row["attrs"]))
    layout = row["layout"]
    spec = LayoutSpec.from_json(json.loads(layout)) if layout else None
    return NodeEntry(path, "directory", 0, row["mtime"], default_layout=spec)


def inherited(rows: Sequence[Row]) -> LayoutSpec:
    """The default layout a new file below the walked directories inherits: the
    nearest directory's, field by field."""
    spec = LayoutSpec()
    for row in reversed([r for r in rows if r["kind"] == "directory"]):
        if row["layout"]:
            spec = spec.merged_over(LayoutSpec.from_json(json.loads(row["layout"])))
    return spec


async def touch(conn: asyncpg.Connection, dir_id: int, now: float) -> None:
    await conn.execute("UPDATE entries SET mtime = $1 WHERE id = $2", now, dir_id)


async def has_child(conn: asyncpg.Connection, dir_id: int) -> bool:
    return bool(await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM entries WHERE parent = $1)", dir_id))


async def garbage_file(conn: asyncpg.Connection, row: Row, now: float) -> None:
    await conn.execute(
        "INSERT INTO garbage VALUES ($1, $2, $3, $4) ON CONFLICT (file_id) DO UPDATE "
        "SET layout = EXCLUDED.layout, size = EXCLUDED.size, since = EXCLUDED.since",
        row["file_id"], row["layout"], row["size"], now)


# -- namespace -----------------------------------------------------------------------------
async def stat(conn: asyncpg.Connection, path: str, checksums: bool) -> NodeEntry:
    path = paths.normalize(path)
    return entry(path, await resolve(conn, path), checksums)


async def list_rows(conn: asyncpg.Connection, path: str, after: str, limit: int
                    ) -> list[Listed]:
    """A page as SQLite's (:mod:`..sqlite.listing`): one range of the (parent, name)
    index, a tuple per row."""
    path = paths.normalize(path)
    dir_id = await resolve_dir(conn, path)
    rows = await conn.fetch(_SCAN, dir_id, after, limit)
    base = path.rstrip("/") + "/"        # names in the table are single valid components
    return [listed(base, r) for r in rows]


async def mkdirs(conn: asyncpg.Connection, path: str, rows: Sequence[Row], *, parents: bool,
                 exist_ok: bool, now: float) -> int:
    """Create the directory ``path`` (and its parents), whose walk is ``rows`` (it may
    go one entry further: only the part up to ``path`` counts); returns its id."""
    current = ROOT_ID
    walked = ""
    names = paths.parts(path)
    for i, part in enumerate(names):
        walked += "/" + part
        last = i == len(names) - 1
        if i + 1 >= len(rows):           # missing from here on
            if not last and not parents:
                raise NotFound(f"parent directory {walked} does not exist", path=path)
            made = await conn.fetchval(
                "INSERT INTO entries (parent, name, kind, mtime) "
                "VALUES ($1, $2, 'directory', $3) RETURNING id", current, part, now)
            await touch(conn, current, now)
            current = int(made)
            continue
        found = rows[i + 1]
        if found["kind"] != "directory":
            if last:
                raise AlreadyExists(f"{walked} exists and is a file", path=path)
            raise NotADirectory(f"{walked} is not a directory", path=path)
        if last and not exist_ok:
            raise AlreadyExists(f"directory {walked} already exists", path=path)
        current = int(found["id"])
    return current


async def mkdir(conn: asyncpg.Connection, path: str, *, parents: bool, exist_ok: bool,
                now: float, layout: LayoutSpec | None) -> NodeEntry:
    path = paths.normalize(path)
    if path == "/" and not exist_ok:
        raise AlreadyExists("the root always exists", path=path)
    dir_id = await mkdirs(conn, path, await walk(conn, paths.parts(path)), parents=parents,
                          exist_ok=exist_ok, now=now)
    if layout is not None and layout.to_json():
        await conn.execute("UPDATE entries SET layout = $1 WHERE id = $2",
                           json.dumps(layout.to_json()), dir_id)
    return await stat(conn, path, True)


async def set_layout(conn: asyncpg.Connection, path: str, layout: LayoutSpec) -> NodeEntry:
    path = paths.normalize(path)
    dir_id = await resolve_dir(conn, path)
    value = json.dumps(layout.to_json()) if layout.to_json() else None
    await conn.execute("UPDATE entries SET layout = $1 WHERE id = $2", value, dir_id)
    return await stat(conn, path, True)


# A rename's changes in one statement: the entry moved, both parents touched, and the
# manifests on or above them bumped (no row is updated twice: a directory is never
# moved into itself, so the moved entry is neither parent).
_MOVE = _bump_up_from(
    "SELECT unnest($1::bigint[])",
    "moved AS (UPDATE entries SET parent = $2, name = $3 WHERE id = $4), "
    "touched AS (UPDATE entries SET mtime = $5 WHERE id = ANY($1::bigint[])), ")


async def rename(conn: asyncpg.Connection, src: str, dst: str, *, overwrite: bool,
                 now: float) -> NodeEntry:
    """Two walks (one statement each: the source, and the destination with its parents),
    then the move in one statement: a rename is five round trips with BEGIN and COMMIT."""
    src, dst = paths.normalize(src), paths.normalize(dst)
    if src == "/" or dst == "/":
        raise InvalidPath("cannot rename the root")
    src_names = paths.parts(src)
    src_rows = list(await conn.fetch(_WALK_QUOTAS, src_names))
    row = located(src, src_names, src_rows)
    if src == dst:
        return entry(dst, row, False)
    if row["kind"] == "directory" and paths.is_within(dst, src):
        raise InvalidPath(f"cannot move {src} inside itself", src=src, dst=dst)
    dst_parent, dst_name = paths.split(dst)
    dst_names = paths.parts(dst)
    dst_rows = list(await conn.fetch(_WALK_QUOTAS, dst_names))
    # the destination's parent, from the same walk (resolve_dir's errors)
    parent = located(dst_parent, dst_names[:-1], dst_rows[:len(dst_names)])
    if parent["kind"] != "directory":
        raise NotADirectory(f"{dst_parent} is not a directory", path=dst_parent)
    replaced = (0, 0)
    if len(dst_rows) == len(dst_names) + 1:
        existing = dst_rows[-1]
        await _replace_for_rename(conn, row, existing, dst, overwrite, now)
        if existing["kind"] == "file":
            replaced = (await quotas.charged(conn, existing), 1)
    await quotas.move(conn, quotas.on_walk(src_rows[:-1]),
                      quotas.on_walk(dst_rows[:len(dst_names)]), int(row["id"]), replaced,
                      path=dst)
    parents = sorted({int(src_rows[-2]["id"]), int(parent["id"])})
    await conn.execute(_MOVE, parents, int(parent["id"]), dst_name, int(row["id"]), now)
    return entry(dst, row, False)


async def _replace_for_rename(conn: asyncpg.Connection, row: Row, existing: Row, dst: str,
                              overwrite: bool, now: float) -> None:
    if existing["kind"] == "directory":
        if row["kind"] != "directory":
            raise IsADirectory(f"{dst} is a directory", path=dst)
        if await has_child(conn, existing["id"]):
            raise DirectoryNotEmpty(f"{dst} is not empty", path=dst)
    elif row["kind"] == "directory":
        raise NotADirectory(f"{dst} is a file", path=dst)
    elif not overwrite:
        raise AlreadyExists(f"{dst} already exists", path=dst)
    else:
        await garbage_file(conn, existing, now)
    await conn.execute("DELETE FROM entries WHERE id = $1", existing["id"])


_SUBTREE = ("WITH RECURSIVE sub(id) AS (SELECT $1::bigint UNION ALL "
            "SELECT e.id FROM entries e JOIN sub ON e.parent = sub.id) ")


async def remove(conn: asyncpg.Connection, path: str, *, recursive: bool, now: float) -> int:
    path = paths.normalize(path)
    if path == "/":
        raise InvalidPath("cannot remove the root")
    row = await resolve(conn, path)
    parent_id = await resolve_dir(conn, paths.split(path)[0])
    if row["kind"] == "file":
        await quotas.charge(conn, parent_id, -await quotas.charged(conn, row), -1, path=path)
        await garbage_file(conn, row, now)
        await conn.execute("DELETE FROM entries WHERE id = $1", row["id"])
        await touch(conn, parent_id, now)
        await changed_below(conn, [parent_id])
        return 1
    if not recursive and await has_child(conn, row["id"]):
        raise DirectoryNotEmpty(f"{path} is not empty", path=path)
    if await quotas.above(conn, parent_id):
        size, files = await quotas.totals(conn, row["id"])
        await quotas.charge(conn, parent_id, -size, -files, path=path)
    status = await conn.execute(
        _SUBTREE + "INSERT INTO garbage SELECT file_id, layout, size, $2 FROM entries "
        "WHERE id IN (SELECT id FROM sub) AND kind = 'file' ON CONFLICT (file_id) DO UPDATE "
        "SET layout = EXCLUDED.layout, size = EXCLUDED.size, since = EXCLUDED.since",
        row["id"], now)
    await conn.execute(_SUBTREE + "DELETE FROM entries WHERE id IN (SELECT id FROM sub)",
                       row["id"])
    await touch(conn, parent_id, now)
    await changed_below(conn, [parent_id])
    return int(status.split()[-1])           # "INSERT 0 <rows>"


async def counts(conn: asyncpg.Connection) -> tuple[int, int, int]:
    row = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE kind = 'file'), "
        "count(*) FILTER (WHERE kind = 'directory'), "
        "COALESCE(sum(size) FILTER (WHERE kind = 'file'), 0) FROM entries")
    return int(row[0]), int(row[1]), int(row[2])


async def subtree_files(conn: asyncpg.Connection, path: str) -> dict[str, NodeEntry]:
    path = paths.normalize(path)
    dir_id = await resolve_dir(conn, path)
    rows = await conn.fetch(
        "WITH RECURSIVE sub(id, rel, kind) AS ("
        " SELECT id, name::text, kind FROM entries WHERE parent = $1"
        " UNION ALL SELECT e.id, sub.rel || '/' || e.name, e.kind"
        " FROM entries e JOIN sub ON e.parent = sub.id WHERE sub.kind = 'directory')"
        " SELECT sub.rel, e.size, e.mtime, e.file_id, e.layout, e.checksums"
        " FROM sub JOIN entries e ON e.id = sub.id WHERE sub.kind = 'file'", dir_id)
    return subtree_entries(path, rows)


# -- manifests ------------------------------------------------------------------------------
async def put_manifest(conn: asyncpg.Connection, path: str, body: bytes, now: float) -> None:
    dir_id = await resolve_dir(conn, paths.normalize(path))
    await conn.execute(
        "INSERT INTO manifests VALUES ($1, $2, $3) ON CONFLICT (dir_id) DO UPDATE "
        "SET body = EXCLUDED.body, created = EXCLUDED.created, gen = manifests.gen + 1",
        dir_id, body, now)


async def get_manifest(conn: asyncpg.Connection, path: str) -> tuple[bytes, float]:
    path = paths.normalize(path)
    row = await conn.fetchrow("SELECT body, created FROM manifests WHERE dir_id = $1",
                              await resolve_dir(conn, path))
    if row is None:
        raise NotFound(f"no manifest recorded for {path}", path=path)
    return bytes(row[0]), float(row[1])


async def manifest_version(conn: asyncpg.Connection, path: str) -> ManifestVersion:
    """One statement: the path's walk, with the manifest of each directory on it."""
    path = paths.normalize(path)
    names = paths.parts(path)
    rows = await conn.fetch(_WALK_CTE + "SELECT walk.*, m.gen, m.created AS made FROM walk "
                            "LEFT JOIN manifests m ON m.dir_id = walk.id ORDER BY depth",
                            list(names))
    row = located(path, names, rows)
    if row["kind"] != "directory":
        raise NotADirectory(f"{path} is not a directory", path=path)
    if row["gen"] is None:
        raise NotFound(f"no manifest recorded for {path}", path=path)
    return ManifestVersion(int(row["id"]), int(row["gen"]), float(row["made"]))
