"""The SQL of quotas and pins in the SQLite store, and the quota check both stores use.

A quota row sits on its directory's row id (it follows the directory through a
rename, and goes with it) and keeps the subtree's use (a file of an attached
directory counts its filled bytes only: :mod:`.sqlite.cache` charges each fill and
refunds each eviction): the namespace's writes
call :meth:`QuotaSQL.charge` / :meth:`QuotaSQL.move` inside their own
transaction, so a write that would pass a limit raises and rolls back whole
(:mod:`stager.meta.quotas` says why the use is kept, not summed per write).
Pins are by path.  Blocking; runs on the store's one thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ....errors import NotFound, QuotaExceeded
from ....protocol.models import Layout
from ....protocol.quotas import Pin, Quota
from .db import Database, layout_of

# (dir_id, max_bytes, max_files, used_bytes, used_files)
QuotaRow = tuple[int, int | None, int | None, int, int]

_COLS = "q.dir_id, q.max_bytes, q.max_files, q.used_bytes, q.used_files"
# The quotas on a directory and on every directory above it: the walk up the parent
# chain (a few rows) joined to the small quotas table.
_ABOVE = ("WITH RECURSIVE up(id) AS (SELECT ? UNION SELECT e.parent FROM entries e "
          "JOIN up ON e.id = up.id WHERE e.parent <> 0) "
          f"SELECT {_COLS} FROM quotas q JOIN up ON q.dir_id = up.id")
# The bytes a file's row ``e`` counts for: its size, or for a file of an attached
# directory its filled chunks' bytes (a chunk not fetched is no byte stored).
_FILLED = ("(SELECT COALESCE(SUM(c.size), 0) FROM cache_chunks c "
           "WHERE c.file_id = e.file_id AND c.crc IS NOT NULL)")
_CHARGED = f"CASE WHEN json_extract(e.layout, '$.cached') THEN {_FILLED} ELSE e.size END"
_SUBTREE = ("WITH RECURSIVE sub(id) AS (SELECT ? UNION ALL "
            "SELECT e.id FROM entries e JOIN sub ON e.parent = sub.id) "
            f"SELECT COALESCE(SUM({_CHARGED}), 0), COUNT(*) FROM entries e "
            "WHERE e.id IN (SELECT id FROM sub) AND e.kind = 'file'")
_PATH = ("WITH RECURSIVE up(id, parent, name, depth) AS ("
         "SELECT id, parent, name, 0 FROM entries WHERE id = ? UNION ALL "
         "SELECT e.id, e.parent, e.name, up.depth + 1 FROM entries e "
         "JOIN up ON e.id = up.parent) SELECT name FROM up ORDER BY depth DESC")


def over_limit(rows: Iterable[QuotaRow], d_bytes: int, d_files: int
               ) -> tuple[QuotaRow, str] | None:
    """The first quota that adding ``d_bytes`` and ``d_files`` would take past a limit,
    and which (``"bytes"`` or ``"files"``); ``None`` when all hold.  Only a growth
    is refused: a write that shrinks the use passes even where a quota set below the
    use is already over."""
    for row in rows:
        _, max_bytes, max_files, used_bytes, used_files = row
        if d_bytes > 0 and max_bytes is not None and used_bytes + d_bytes > max_bytes:
            return row, "bytes"
        if d_files > 0 and max_files is not None and used_files + d_files > max_files:
            return row, "files"
    return None


def exceeded(path: str, directory: str, resource: str, limit: int, use: int,
             adding: int) -> QuotaExceeded:
    """The error of a write at ``path`` refused by the quota on ``directory``."""
    return QuotaExceeded(
        f"{path}: the quota of {directory} is {limit} {resource}, {use} in use; this "
        f"write needs {adding} more", path=path, directory=directory, resource=resource,
        limit=limit, use=use)


def path_of_names(names: Sequence[str]) -> str:
    """The path of a directory from the names of the walk up to it, root first."""
    return "/" + "/".join(names[1:])


class QuotaSQL:
    """Quotas by directory row id, pins by path."""

    def __init__(self, database: Database) -> None:
        self.db = database.db
        self.tx: Callable[[], AbstractContextManager[object]] = database.transaction

    # -- the namespace's writes call these inside their transaction -------------
    def active(self) -> bool:
        """Whether any quota is set: when none is, a write pays one lookup only."""
        return self.db.execute("SELECT EXISTS (SELECT 1 FROM quotas)").fetchone()[0] == 1

    def above(self, dir_id: int) -> list[QuotaRow]:
        return [tuple(r) for r in self.db.execute(_ABOVE, (dir_id,))]  # type: ignore[misc]

    def totals(self, entry_id: int) -> tuple[int, int]:
        """(bytes, files) of the file or the subtree at row ``entry_id``."""
        size, files = self.db.execute(_SUBTREE, (entry_id,)).fetchone()
        return int(size), int(files)

    def charged(self, row: Sequence[Any]) -> int:
        """The bytes the file of namespace row ``(id, kind, size, mtime, file_id,
        layout, …)`` counts for (``_CHARGED``)."""
        if not layout_of(row[5]).cached:
            return int(row[2])
        return int(self.db.execute("SELECT " + _FILLED.replace("e.file_id", "?"),
                                   (row[4],)).fetchone()[0])

    def replacing(self, layout: Layout, size: int, existing: Sequence[Any] | None) -> int:
        """The bytes a commit of ``size`` bytes in ``layout`` adds where the file of
        row ``existing`` (or none) was: a cached file's bytes come with its fills."""
        return (0 if layout.cached else size) - (self.charged(existing) if existing else 0)

    def refund_chunks(self, where: str, params: Sequence[Any]) -> None:
        """Before the chunk rows ``c`` that match ``where`` are deleted: their filled
        bytes leave the quotas above their files (a row of a file no longer in the
        namespace was refunded when the file went, and counts nowhere; only a cached
        file's rows count, as in ``_CHARGED``)."""
        if not self.active():
            return
        rows = self.db.execute(
            "SELECT e.parent, SUM(c.size) FROM cache_chunks c JOIN entries e "
            "ON e.file_id = c.file_id AND e.kind = 'file' AND json_extract(e.layout, '$.cached') "
            f"WHERE c.crc IS NOT NULL AND ({where}) GROUP BY e.parent", params).fetchall()
        for parent, size in rows:
            self.charge(int(parent), -int(size), 0, path="")    # a refund is never refused

    def charge(self, dir_id: int, d_bytes: int, d_files: int, *, path: str) -> None:
        """Add to the use of every quota on directory ``dir_id`` or above it; raise
        QuotaExceeded (for the write at ``path``) when that passes a limit."""
        if (d_bytes or d_files) and self.active():
            self._apply(self.above(dir_id), d_bytes, d_files, path)

    def move(self, src_dir: int, dst_dir: int, d_bytes: int, d_files: int, *,
             path: str) -> None:
        """``(d_bytes, d_files)`` move from below ``src_dir`` to below ``dst_dir``:
        the quotas above one only lose or gain it (those above both keep it)."""
        if not (d_bytes or d_files) or not self.active():
            return
        src = {r[0]: r for r in self.above(src_dir)}
        dst = {r[0]: r for r in self.above(dst_dir)}
        self._apply([r for k, r in src.items() if k not in dst], -d_bytes, -d_files, path)
        self._apply([r for k, r in dst.items() if k not in src], d_bytes, d_files, path)

    def _apply(self, rows: list[QuotaRow], d_bytes: int, d_files: int, path: str) -> None:
        refused = over_limit(rows, d_bytes, d_files)
        if refused is not None:
            row, resource = refused
            limit, use, adding = ((row[1], row[3], d_bytes) if resource == "bytes"
                                  else (row[2], row[4], d_files))
            assert limit is not None
            raise exceeded(path, self.dir_path(row[0]), resource, limit, use, adding)
        self.db.executemany(
            "UPDATE quotas SET used_bytes = used_bytes + ?, used_files = used_files + ? "
            "WHERE dir_id = ?", [(d_bytes, d_files, r[0]) for r in rows])

    def dir_path(self, dir_id: int) -> str:
        return path_of_names([r[0] for r in self.db.execute(_PATH, (dir_id,))])

    # -- the Quotas role ------------------------------------------------------------
    def set_quota(self, dir_id: int, path: str, max_bytes: int | None,
                  max_files: int | None) -> Quota:
        """In the caller's transaction, ``dir_id`` resolved from ``path``."""
        used_bytes, used_files = self.totals(dir_id)
        if max_bytes is None and max_files is None:
            self.db.execute("DELETE FROM quotas WHERE dir_id = ?", (dir_id,))
        else:
            self.db.execute("INSERT OR REPLACE INTO quotas VALUES (?, ?, ?, ?, ?)",
                            (dir_id, max_bytes, max_files, used_bytes, used_files))
        return Quota(path, max_bytes, max_files, used_bytes, used_files)

    def list_quotas(self) -> list[Quota]:
        rows = self.db.execute(f"SELECT {_COLS} FROM quotas q").fetchall()
        return sorted((Quota(self.dir_path(r[0]), *r[1:]) for r in rows),
                      key=lambda q: q.path)

    # -- the Pins role ----------------------------------------------------------------
    def pin(self, path: str, expires: float | None, now: float) -> Pin:
        with self.tx():
            self.db.execute("INSERT OR REPLACE INTO pins VALUES (?, ?, ?)",
                            (path, expires, now))
        return Pin(path, expires, now)

    def unpin(self, path: str) -> None:
        with self.tx():
            if self.db.execute("DELETE FROM pins WHERE path = ?", (path,)).rowcount != 1:
                raise NotFound(f"{path} is not pinned", path=path)

    def pins(self, now: float) -> list[Pin]:
        with self.tx():
            self.db.execute("DELETE FROM pins WHERE expires IS NOT NULL AND expires <= ?",
                            (now,))
            rows = self.db.execute("SELECT path, expires, created FROM pins ORDER BY path")
            return [Pin(*r) for r in rows]
