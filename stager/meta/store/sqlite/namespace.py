"""The SQL of the namespace, uploads, manifests, garbage and targets.

Blocking; runs on the store's one thread (see :class:`~.sqlite.store.SQLiteStore`,
whose methods say what each guarantees).  Each write is one transaction (a
savepoint inside a batch or a group commit: :meth:`.Database.transaction`); the
writes of uploads take a batch, one transaction whose items each fail alone (a
savepoint each), so a failed item leaves nothing behind and the others commit.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from ....errors import (
    AlreadyExists,
    DirectoryNotEmpty,
    InvalidPath,
    IsADirectory,
    NotADirectory,
    NotFound,
    QuotaExceeded,
    StagerError,
    UploadNotFound,
)
from ....protocol import paths
from ....protocol.models import Layout, LayoutSpec, TargetInfo, attrs_text
from ....protocol.quotas import Pin, Quota
from ..base import (
    CommitArgs,
    CreateCheck,
    Garbage,
    Listed,
    ManifestVersion,
    NodeEntry,
    Upload,
    committing,
)
from ..spec import check_replaceable, checked_create
from . import listing
from .db import ROOT_ID, Database, attrs_from, layout_of, layout_text, pack, subtree_entries, unpack
from .lookup import joined_row
from .quotas import QuotaSQL

_COLS = "id, kind, size, mtime, file_id, layout, checksums, attrs"
Row = tuple[Any, ...]
Placed = tuple[int, Row | None]     # a new file's directory (its id) and the row at its path
R = TypeVar("R")


def _each(fn: Callable[..., R], *args: Any) -> R | StagerError:
    """``fn(*args)``, one item of a batch: its error in its place."""
    try:
        return fn(*args)
    except StagerError as exc:
        return exc


class NamespaceSQL:
    """Paths resolved one component at a time from the root (``entries`` rows by
    ``(parent, name)``); deleted, replaced and abandoned files go to ``garbage``."""

    def __init__(self, database: Database, connection: sqlite3.Connection | None = None) -> None:
        # ``connection``: another than the writer's, for reads only (Database.reader)
        self.db = database.db if connection is None else connection
        self.tx: Callable[[], AbstractContextManager[object]] = database.transaction
        # Marks a directory whose manifests (and its ancestors') the write changes.
        self.changed: Callable[[int], None] = database.changed_below
        # The use of the quotas above a write, changed in the write's transaction.
        self.quotas = QuotaSQL(database)

    # -- path resolution --------------------------------------------------------
    def child(self, parent_id: int, name: str) -> Row | None:
        return self.db.execute(
            f"SELECT {_COLS} FROM entries WHERE parent = ? AND name = ?",
            (parent_id, name)).fetchone()

    def resolve(self, path: str) -> Row:
        """The row at ``path``; NotFound or NotADirectory when it is not there."""
        names = paths.parts(path)
        # The root is always a directory: its own row is read only when it is asked for.
        row: Row = (ROOT_ID, "directory") if names else self.db.execute(
            f"SELECT {_COLS} FROM entries WHERE id = ?", (ROOT_ID,)).fetchone()
        walked = ""
        for part in names:
            if row[1] != "directory":
                raise NotADirectory(f"{walked} is not a directory", path=path)
            child = self.child(row[0], part)
            walked += "/" + part
            if child is None:
                raise NotFound(f"no such file or directory: {walked}", path=path)
            row = child
        return row

    def found(self, path: str) -> Listed | None:
        """The row of the entry at normalised ``path`` in one statement (:mod:`.lookup`),
        or None where it is not all there: :meth:`stat` walks it then, and says what is
        missing."""
        row = joined_row(self.db, paths.parts(path), listing.LISTED)
        return None if row is None else listing.listed(path[:path.rfind("/") + 1], row)

    def _resolve_dir(self, path: str) -> int:
        row = self.resolve(path)
        if row[1] != "directory":
            raise NotADirectory(f"{path} is not a directory", path=path)
        return int(row[0])

    def _entry(self, path: str, row: Row, checksums: bool) -> NodeEntry:
        _, kind, size, mtime, file_id, layout, blob, attrs = row
        if kind == "file":
            return NodeEntry(path, kind, size, mtime, file_id, layout=layout_of(layout),
                             checksums=unpack(blob) if checksums else None,
                             attrs=attrs_from(attrs))
        spec = LayoutSpec.from_json(json.loads(layout)) if layout else None
        return NodeEntry(path, kind, 0, mtime, default_layout=spec)

    def _has_child(self, dir_id: int) -> bool:
        return self.db.execute("SELECT 1 FROM entries WHERE parent = ? LIMIT 1",
                               (dir_id,)).fetchone() is not None

    def _touch(self, dir_id: int, now: float) -> None:
        self.db.execute("UPDATE entries SET mtime = ? WHERE id = ?", (now, dir_id))

    # -- namespace --------------------------------------------------------------
    def stat(self, path: str, *, checksums: bool = True) -> NodeEntry:
        path = paths.normalize(path)
        return self._entry(path, self.resolve(path), checksums)

    def list_rows(self, path: str, *, after: str, limit: int) -> list[Listed]:
        path = paths.normalize(path)
        return listing.list_rows(self.db, self._resolve_dir(path), path, after, limit)

    def _mkdirs(self, path: str, *, parents: bool, exist_ok: bool, now: float) -> int:
        """Create the directory ``path`` (and parents); returns its id.  In a transaction."""
        current = ROOT_ID
        walked = ""
        names = paths.parts(path)
        for i, part in enumerate(names):
            walked += "/" + part
            last = i == len(names) - 1
            child = self.child(current, part)
            if child is None:
                if not last and not parents:
                    raise NotFound(f"parent directory {walked} does not exist", path=path)
                cur = self.db.execute(
                    "INSERT INTO entries (parent, name, kind, mtime) VALUES (?, ?, 'directory', ?)",
                    (current, part, now))
                self._touch(current, now)
                current = int(cur.lastrowid or 0)
                continue
            if child[1] != "directory":
                if last:
                    raise AlreadyExists(f"{walked} exists and is a file", path=path)
                raise NotADirectory(f"{walked} is not a directory", path=path)
            if last and not exist_ok:
                raise AlreadyExists(f"directory {walked} already exists", path=path)
            current = int(child[0])
        return current

    def mkdir(self, path: str, *, parents: bool, exist_ok: bool, now: float,
              layout: LayoutSpec | None = None) -> NodeEntry:
        path = paths.normalize(path)
        if path == "/":
            if not exist_ok:
                raise AlreadyExists("the root always exists", path=path)
        with self.tx():
            dir_id = self._mkdirs(path, parents=parents, exist_ok=exist_ok, now=now)
            if layout is not None and layout.to_json():
                self.db.execute("UPDATE entries SET layout = ? WHERE id = ?",
                                (json.dumps(layout.to_json()), dir_id))
        return self.stat(path)

    def set_layout(self, path: str, layout: LayoutSpec) -> NodeEntry:
        path = paths.normalize(path)
        with self.tx():
            dir_id = self._resolve_dir(path)
            value = json.dumps(layout.to_json()) if layout.to_json() else None
            self.db.execute("UPDATE entries SET layout = ? WHERE id = ?", (value, dir_id))
        return self.stat(path)

    @staticmethod
    def inherited_layout(chain: Sequence[Row]) -> LayoutSpec:
        """What a new file below the directories ``chain`` (the root first) inherits."""
        spec = LayoutSpec()
        for row in reversed(chain):          # nearest directory wins, field by field
            if row[5]:
                spec = spec.merged_over(LayoutSpec.from_json(json.loads(row[5])))
        return spec

    def _garbage_file(self, row: Row, now: float) -> None:
        _, _, size, _, file_id, layout, *_ = row
        self.db.execute("INSERT OR REPLACE INTO garbage VALUES (?, ?, ?, ?)",
                        (file_id, layout, size, now))

    def rename(self, src: str, dst: str, *, overwrite: bool, now: float) -> NodeEntry:
        src, dst = paths.normalize(src), paths.normalize(dst)
        if src == "/" or dst == "/":
            raise InvalidPath("cannot rename the root")
        with self.tx():
            row = self.resolve(src)
            if src == dst:
                return self._entry(dst, row, False)
            if row[1] == "directory" and paths.is_within(dst, src):
                raise InvalidPath(f"cannot move {src} inside itself", src=src, dst=dst)
            dst_parent, dst_name = paths.split(dst)
            parent_id = self._resolve_dir(dst_parent)
            existing = self.child(parent_id, dst_name)
            if existing is not None:
                self._replace_for_rename(row, existing, dst, overwrite, now)
                if existing[1] == "file":
                    self.quotas.charge(parent_id, -self.quotas.charged(existing), -1, path=dst)
            src_parent = self._resolve_dir(paths.split(src)[0])
            if self.quotas.active():
                size, files = self.quotas.totals(row[0])
                self.quotas.move(src_parent, parent_id, size, files, path=dst)
            self.db.execute("UPDATE entries SET parent = ?, name = ? WHERE id = ?",
                            (parent_id, dst_name, row[0]))
            self._touch(src_parent, now)
            self._touch(parent_id, now)
            self.changed(src_parent)
            self.changed(parent_id)
        return self.stat(dst, checksums=False)

    def _replace_for_rename(self, row: Row, existing: Row, dst: str,
                            overwrite: bool, now: float) -> None:
        if existing[1] == "directory":
            if row[1] != "directory":
                raise IsADirectory(f"{dst} is a directory", path=dst)
            has_child = self._has_child(existing[0])
            if has_child:
                raise DirectoryNotEmpty(f"{dst} is not empty", path=dst)
        elif row[1] == "directory":
            raise NotADirectory(f"{dst} is a file", path=dst)
        elif not overwrite:
            raise AlreadyExists(f"{dst} already exists", path=dst)
        else:
            self._garbage_file(existing, now)
        self.db.execute("DELETE FROM entries WHERE id = ?", (existing[0],))

    def remove(self, path: str, *, recursive: bool, now: float) -> int:
        path = paths.normalize(path)
        if path == "/":
            raise InvalidPath("cannot remove the root")
        with self.tx():
            row = self.resolve(path)
            parent_id = self._resolve_dir(paths.split(path)[0])
            if row[1] == "file":
                self.quotas.charge(parent_id, -self.quotas.charged(row), -1, path=path)
                self._garbage_file(row, now)
                self.db.execute("DELETE FROM entries WHERE id = ?", (row[0],))
                self._touch(parent_id, now)
                self.changed(parent_id)
                return 1
            has_child = self._has_child(row[0])
            if has_child and not recursive:
                raise DirectoryNotEmpty(f"{path} is not empty", path=path)
            if self.quotas.active():
                size, files = self.quotas.totals(row[0])
                self.quotas.charge(parent_id, -size, -files, path=path)
            subtree = ("WITH RECURSIVE sub(id) AS (SELECT ? UNION ALL "
                       "SELECT e.id FROM entries e JOIN sub ON e.parent = sub.id) ")
            # Python's sqlite3 gives rowcount -1 for a statement that begins with
            # WITH, so count the garbage rows through total_changes instead.
            before = self.db.total_changes
            self.db.execute(
                subtree + "INSERT OR REPLACE INTO garbage "
                "SELECT file_id, layout, size, ? FROM entries "
                "WHERE id IN (SELECT id FROM sub) AND kind = 'file'", (row[0], now))
            files = self.db.total_changes - before
            self.db.execute(subtree + "DELETE FROM entries WHERE id IN (SELECT id FROM sub)",
                            (row[0],))
            self._touch(parent_id, now)
            self.changed(parent_id)
            return max(files, 0)

    def counts(self) -> tuple[int, int, int]:
        files, size = self.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM entries WHERE kind = 'file'").fetchone()
        dirs = self.db.execute(
            "SELECT COUNT(*) FROM entries WHERE kind = 'directory'").fetchone()[0]
        return int(files), int(dirs), int(size)

    def subtree_files(self, path: str) -> dict[str, NodeEntry]:
        path = paths.normalize(path)
        dir_id = self._resolve_dir(path)
        rows = self.db.execute(
            "WITH RECURSIVE sub(id, rel, kind) AS ("
            " SELECT id, name, kind FROM entries WHERE parent = ?"
            " UNION ALL SELECT e.id, sub.rel || '/' || e.name, e.kind"
            " FROM entries e JOIN sub ON e.parent = sub.id WHERE sub.kind = 'directory')"
            " SELECT sub.rel, e.size, e.mtime, e.file_id, e.layout, e.checksums"
            " FROM sub JOIN entries e ON e.id = sub.id WHERE sub.kind = 'file'",
            (dir_id,)).fetchall()
        return subtree_entries(path, rows)

    # -- quotas and pins (.sqlite.quotas) -------------------------------------------
    def set_quota(self, path: str, max_bytes: int | None, max_files: int | None) -> Quota:
        path = paths.normalize(path)
        with self.tx():
            return self.quotas.set_quota(self._resolve_dir(path), path, max_bytes, max_files)

    def pin(self, path: str, expires: float | None, now: float) -> Pin:
        path = paths.normalize(path)
        self.resolve(path)          # NotFound when nothing is there
        return self.quotas.pin(path, expires, now)

    # -- manifests --------------------------------------------------------------
    def put_manifest(self, path: str, body: bytes, *, now: float) -> None:
        with self.tx():
            dir_id = self._resolve_dir(paths.normalize(path))
            self.db.execute(
                "INSERT INTO manifests (dir_id, body, created) VALUES (?, ?, ?) "
                "ON CONFLICT (dir_id) DO UPDATE SET body = excluded.body, "
                "created = excluded.created, gen = gen + 1", (dir_id, body, now))

    def get_manifest(self, path: str) -> tuple[bytes, float]:
        path = paths.normalize(path)
        row = self.db.execute("SELECT body, created FROM manifests WHERE dir_id = ?",
                              (self._resolve_dir(path),)).fetchone()
        if row is None:
            raise NotFound(f"no manifest recorded for {path}", path=path)
        return bytes(row[0]), float(row[1])

    def manifest_version(self, path: str) -> ManifestVersion:
        path = paths.normalize(path)
        dir_id = self._resolve_dir(path)
        row = self.db.execute("SELECT gen, created FROM manifests WHERE dir_id = ?",
                              (dir_id,)).fetchone()
        if row is None:
            raise NotFound(f"no manifest recorded for {path}", path=path)
        return ManifestVersion(dir_id, int(row[0]), float(row[1]))

    # -- uploads: each call a batch, one transaction; an item fails alone ----------
    def check_creates(self, items: Sequence[CreateCheck]) -> list[LayoutSpec | StagerError]:
        parents: dict[str, tuple[int | None, LayoutSpec] | StagerError] = {}
        out: list[LayoutSpec | StagerError] = []
        for item in items:
            parent = paths.split(item[0])[0]
            if parent not in parents:
                parents[parent] = self.parent_state(parent)
            out.append(checked_create(item, parents[parent], self.child))
        return out

    def parent_state(self, parent: str) -> tuple[int | None, LayoutSpec] | StagerError:
        """(the parent directory's row id or None when it is missing, the layout its
        new files inherit), or the error every file in it gets: one walk down the
        path, the directories met kept for their layouts."""
        row = self.db.execute(f"SELECT {_COLS} FROM entries WHERE id = ?", (ROOT_ID,)).fetchone()
        chain, walked = [row], ""
        for part in paths.parts(parent):
            row, walked = self.child(row[0], part), walked + "/" + part
            if row is None:
                return None, self.inherited_layout(chain)
            if row[1] != "directory":
                return NotADirectory(f"{walked} is not a directory", path=parent)
            chain.append(row)
        return int(chain[-1][0]), self.inherited_layout(chain)

    def begin_uploads(self, uploads: Sequence[Upload]) -> None:
        with self.tx():
            self.db.executemany("INSERT INTO uploads VALUES (?, ?, ?, ?, ?, ?)", [
                (u.file_id, u.path, layout_text(u.layout), int(u.overwrite), int(u.parents),
                 u.created) for u in uploads])

    def get_uploads(self, file_ids: Sequence[str]) -> list[Upload | StagerError]:
        return [_each(self._upload, file_id) for file_id in file_ids]

    def _upload(self, file_id: str) -> Upload:
        row = self.db.execute("SELECT * FROM uploads WHERE file_id = ?", (file_id,)).fetchone()
        if row is None:
            raise UploadNotFound(f"no pending upload {file_id}", file_id=file_id)
        return Upload(row[0], row[1], layout_of(row[2]), bool(row[3]), bool(row[4]), row[5])

    def commit_uploads(self, items: Sequence[CommitArgs], *, now: float
                       ) -> list[NodeEntry | StagerError]:
        with self.tx():     # each item's own transaction nests: a savepoint
            out = [_each(self.commit_one, *committing(item), now) for item in items]
            for item, result in zip(items, out, strict=True):
                if isinstance(result, QuotaExceeded):   # final: its chunks are collected
                    self._abort(item[0], now)
            return out

    def commit_one(self, file_id: str, size: int, checksums: tuple[int, ...], mtime: float,
                   attrs: dict[str, Any], now: float, given: Upload | None = None,
                   placed: Placed | None = None) -> NodeEntry:
        """One upload's commit; ``given``: one whose row was never written (put_upload);
        ``placed``: where the check of its path in this transaction found it (not walked
        again)."""
        with self.tx():
            upload = given or self._upload(file_id)
            parent, name = paths.split(upload.path)
            if placed is None:
                parent_id = self._mkdirs(parent, parents=upload.parents, exist_ok=True,
                                         now=now) if parent != "/" else ROOT_ID
                placed = parent_id, self.child(parent_id, name)
            parent_id, existing = placed
            check_replaceable(existing, upload.path, upload.overwrite)
            self.quotas.charge(parent_id, self.quotas.replacing(upload.layout, size, existing),
                               0 if existing else 1, path=upload.path)
            if existing is not None:
                # The same file id again (a keyed request sent twice as a first try:
                # aiohttp re-sends a PUT on a dropped keep-alive connection) replaces
                # its row only: as garbage, its chunks, the new row's too, would go.
                if existing[4] != file_id:
                    self._garbage_file(existing, now)
                self.db.execute("DELETE FROM entries WHERE id = ?", (existing[0],))
            self.db.execute(
                "INSERT INTO entries (parent, name, kind, size, mtime, file_id, layout, checksums,"
                " attrs) VALUES (?, ?, 'file', ?, ?, ?, ?, ?, ?)",
                (parent_id, name, size, mtime, file_id, layout_text(upload.layout),
                 pack(checksums), attrs_text(attrs)))
            if given is None:
                self.db.execute("DELETE FROM uploads WHERE file_id = ?", (file_id,))
            self._touch(parent_id, now)
            self.changed(parent_id)
        return NodeEntry(upload.path, "file", size, mtime, file_id, upload.layout,
                         checksums=checksums, attrs=attrs)

    def abort_uploads(self, file_ids: Sequence[str], *, now: float) -> list[StagerError | None]:
        with self.tx():
            return [_each(self._abort, file_id, now) for file_id in file_ids]

    def _abort(self, file_id: str, now: float) -> None:
        with self.tx():
            upload = self._upload(file_id)
            self.db.execute("DELETE FROM uploads WHERE file_id = ?", (file_id,))
            self.discard(upload, now)

    def discard(self, upload: Upload, now: float) -> None:    # its chunks to the garbage
        self.db.execute("INSERT OR REPLACE INTO garbage VALUES (?, ?, ?, ?)",
                        (upload.file_id, layout_text(upload.layout), 0, now))

    def replace_upload_layout(self, file_id: str, old: Layout, new: Layout) -> bool:
        with self.tx():
            cur = self.db.execute("UPDATE uploads SET layout = ? WHERE file_id = ? AND layout = ?",
                                  (layout_text(new), file_id, layout_text(old)))
            return cur.rowcount == 1

    def expired_uploads(self, before: float) -> list[Upload]:
        # a multipart upload's pending file lives by its record's idle limit (multipart.py)
        ids = self.db.execute("SELECT file_id FROM uploads WHERE created < ?" + (
            "" if before == float("inf") else
            " AND file_id NOT IN (SELECT file_id FROM multipart_uploads)"),
            (before,)).fetchall()
        return [self._upload(r[0]) for r in ids]

    def take_garbage(self, limit: int) -> list[Garbage]:
        rows = self.db.execute("SELECT * FROM garbage ORDER BY since LIMIT ?",
                               (limit,)).fetchall()
        return [Garbage(r[0], layout_of(r[1]), r[2], r[3]) for r in rows]

    def drop_garbage(self, file_ids: list[str], now: float, forget_before: float) -> None:
        with self.tx():
            self.db.execute("DELETE FROM purged WHERE at < ?", (forget_before,))
            self.db.executemany("INSERT OR REPLACE INTO purged "
                                "SELECT file_id, ? FROM garbage WHERE file_id = ?",
                                [(now, f) for f in file_ids])
            self.db.executemany("DELETE FROM garbage WHERE file_id = ?",
                                [(f,) for f in file_ids])

    def retired(self, file_id: str) -> bool:
        return bool(self.db.execute(
            "SELECT EXISTS (SELECT 1 FROM garbage WHERE file_id = ?) "
            "OR EXISTS (SELECT 1 FROM purged WHERE file_id = ?)", (file_id, file_id)
        ).fetchone()[0])

    # -- targets ----------------------------------------------------------------
    def upsert_target(self, target: TargetInfo) -> None:
        with self.tx():
            self.db.execute(
                "INSERT OR REPLACE INTO targets VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (target.id, target.node, target.url, target.capacity, target.used,
                 target.chunks, target.last_heartbeat, target.state))

    def list_targets(self) -> list[TargetInfo]:
        return [_target(r) for r in self.db.execute("SELECT * FROM targets ORDER BY id")]


def _target(row: Row) -> TargetInfo:
    return TargetInfo(id=row[0], node=row[1], url=row[2], capacity=row[3], used=row[4],
                      chunks=row[5], last_heartbeat=row[6], state=row[7])
