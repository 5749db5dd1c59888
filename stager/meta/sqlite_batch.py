"""The SQL of batched writes: part of the SQLite store (see :mod:`.sqlite`).

A batch is one transaction, so one fsync for all its items.  Each item that can
fail alone runs in a savepoint (the store's ``_tx`` nests as one), so a failed
item leaves nothing behind and the others still commit.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from ..errors import AlreadyExists, IsADirectory, NotADirectory, NotFound, StagerError
from ..protocol import paths
from ..protocol.models import LayoutSpec
from .store import NodeEntry, Upload

# (path, overwrite, parents) of one file about to be created
CreateCheck = tuple[str, bool, bool]
# (file_id, size, checksums, mtime) of one upload to commit
CommitArgs = tuple[str, int, tuple[int, ...], float]


class BatchSQL:
    """Mixed into :class:`~stager.meta.sqlite.SQLiteStore`, which provides these."""

    db: sqlite3.Connection

    if TYPE_CHECKING:   # provided by SQLiteStore
        def _tx(self) -> AbstractContextManager[sqlite3.Connection]: ...
        def _resolve(self, path: str) -> tuple[Any, ...]: ...
        def _child(self, parent_id: int, name: str) -> Any: ...
        def inherited_layout(self, path: str) -> LayoutSpec: ...
        def get_upload(self, file_id: str) -> Upload: ...
        def commit_upload(self, file_id: str, *, size: int, checksums: tuple[int, ...],
                          mtime: float, now: float) -> NodeEntry: ...
        def abort_upload(self, file_id: str, *, now: float) -> None: ...

    # -- creates ---------------------------------------------------------------------
    def check_creates(self, items: Sequence[CreateCheck]) -> list[LayoutSpec | StagerError]:
        parents: dict[str, tuple[int | None, LayoutSpec] | StagerError] = {}
        out: list[LayoutSpec | StagerError] = []
        for path, overwrite, make_parents in items:
            parent, name = paths.split(path)
            if parent not in parents:
                parents[parent] = self._parent_state(parent)
            state = parents[parent]
            try:
                if isinstance(state, StagerError):
                    raise state
                parent_id, spec = state
                self._check_one(path, parent, name, parent_id, overwrite, make_parents)
            except StagerError as exc:
                out.append(_copy(exc, path))
                continue
            out.append(spec)
        return out

    def _parent_state(self, parent: str) -> tuple[int | None, LayoutSpec] | StagerError:
        """(the parent directory's row id or None when it is missing, the layout its
        new files inherit), or the error every file in it gets."""
        try:
            row = self._resolve(parent)
        except NotFound:
            return None, self.inherited_layout(paths.join(parent, "x"))
        except NotADirectory as exc:
            return exc
        if row[1] != "directory":
            return NotADirectory(f"{parent} is not a directory", path=parent)
        return int(row[0]), self.inherited_layout(paths.join(parent, "x"))

    def _check_one(self, path: str, parent: str, name: str, parent_id: int | None,
                   overwrite: bool, make_parents: bool) -> None:
        """What :meth:`MetaService._check_creatable` checks for one path."""
        if parent_id is None:
            if not make_parents:
                raise NotFound(f"parent directory {parent} does not exist", path=path)
            return
        existing = self._child(parent_id, name)
        if existing is None:
            return
        if existing[1] == "directory":
            raise IsADirectory(f"{path} is a directory", path=path)
        if not overwrite:
            raise AlreadyExists(f"{path} already exists", path=path)

    def begin_uploads(self, uploads: Sequence[Upload]) -> None:
        with self._tx():
            self.db.executemany("INSERT INTO uploads VALUES (?, ?, ?, ?, ?, ?)", [
                (u.file_id, u.path, json.dumps(u.layout.to_json()), int(u.overwrite),
                 int(u.parents), u.created) for u in uploads])

    # -- commits and aborts ------------------------------------------------------------
    def get_uploads(self, file_ids: Sequence[str]) -> list[Upload | StagerError]:
        out: list[Upload | StagerError] = []
        for file_id in file_ids:
            try:
                out.append(self.get_upload(file_id))
            except StagerError as exc:
                out.append(exc)
        return out

    def commit_uploads(self, items: Sequence[CommitArgs], *, now: float
                       ) -> list[NodeEntry | StagerError]:
        out: list[NodeEntry | StagerError] = []
        with self._tx():
            for file_id, size, checksums, mtime in items:
                try:        # commit_upload's own transaction nests: a savepoint
                    out.append(self.commit_upload(file_id, size=size, checksums=checksums,
                                                  mtime=mtime, now=now))
                except StagerError as exc:
                    out.append(exc)
        return out

    def abort_uploads(self, file_ids: Sequence[str], *, now: float) -> list[StagerError | None]:
        out: list[StagerError | None] = []
        with self._tx():
            for file_id in file_ids:
                try:
                    self.abort_upload(file_id, now=now)
                    out.append(None)
                except StagerError as exc:
                    out.append(exc)
        return out


def _copy(exc: StagerError, path: str) -> StagerError:
    """A parent's error, once per file, naming the file (errors carry their details)."""
    return type(exc)(exc.message, **{**exc.details, "path": path})
