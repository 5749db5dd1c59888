"""The SQL of batched writes (see :mod:`stager.meta.batch`).

A batch is one transaction, so one fsync for all its items.  Each item that can
fail alone runs in a savepoint (the single operation's own transaction nests as
one), so a failed item leaves nothing behind and the others still commit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ....errors import NotADirectory, NotFound, StagerError
from ....protocol import paths
from ....protocol.models import LayoutSpec
from ..base import CommitArgs, CreateCheck, NodeEntry, Upload
from .namespace import NamespaceSQL, check_replaceable


class BatchSQL:
    """Batches of the single operations of :class:`.NamespaceSQL`, each batch one
    transaction, each item failing alone."""

    def __init__(self, namespace: NamespaceSQL) -> None:
        self.namespace = namespace

    # -- creates ---------------------------------------------------------------------
    def check_creates(self, items: Sequence[CreateCheck]) -> list[LayoutSpec | StagerError]:
        parents: dict[str, tuple[int | None, LayoutSpec] | StagerError] = {}
        out: list[LayoutSpec | StagerError] = []
        for item in items:
            parent = paths.split(item[0])[0]
            if parent not in parents:
                parents[parent] = self._parent_state(parent)
            out.append(checked_create(item, parents[parent], self.namespace.child))
        return out

    def _parent_state(self, parent: str) -> tuple[int | None, LayoutSpec] | StagerError:
        """(the parent directory's row id or None when it is missing, the layout its
        new files inherit), or the error every file in it gets."""
        try:
            row = self.namespace.resolve(parent)
        except NotFound:
            return None, self.namespace.inherited_layout(paths.join(parent, "x"))
        except NotADirectory as exc:
            return exc
        if row[1] != "directory":
            return NotADirectory(f"{parent} is not a directory", path=parent)
        return int(row[0]), self.namespace.inherited_layout(paths.join(parent, "x"))

    # -- commits and aborts ------------------------------------------------------------
    def get_uploads(self, file_ids: Sequence[str]) -> list[Upload | StagerError]:
        out: list[Upload | StagerError] = []
        for file_id in file_ids:
            try:
                out.append(self.namespace.get_upload(file_id))
            except StagerError as exc:
                out.append(exc)
        return out

    def commit_uploads(self, items: Sequence[CommitArgs], *, now: float
                       ) -> list[NodeEntry | StagerError]:
        out: list[NodeEntry | StagerError] = []
        with self.namespace.tx():
            for file_id, size, checksums, mtime in items:
                try:        # commit_upload's own transaction nests: a savepoint
                    out.append(self.namespace.commit_upload(
                        file_id, size=size, checksums=checksums, mtime=mtime, now=now))
                except StagerError as exc:
                    out.append(exc)
        return out

    def abort_uploads(self, file_ids: Sequence[str], *, now: float) -> list[StagerError | None]:
        out: list[StagerError | None] = []
        with self.namespace.tx():
            for file_id in file_ids:
                try:
                    self.namespace.abort_upload(file_id, now=now)
                    out.append(None)
                except StagerError as exc:
                    out.append(exc)
        return out


def checked_create(item: CreateCheck, state: tuple[int | None, LayoutSpec] | StagerError,
                   child: Callable[[int, str], Any]) -> LayoutSpec | StagerError:
    """One create's check, in either store: its parent's ``state`` (the parent's id,
    ``None`` where it is still to be made, and the layout it hands down; or why it
    cannot hold a file) and ``child(parent_id, name)``, what is there already."""
    path, overwrite, make_parents = item
    parent, name = paths.split(path)
    try:
        if isinstance(state, StagerError):
            raise state
        parent_id, spec = state
        if parent_id is None:
            if not make_parents:
                raise NotFound(f"parent directory {parent} does not exist", path=path)
        else:
            check_replaceable(child(parent_id, name), path, overwrite)
    except StagerError as exc:
        return for_path(exc, path)
    return spec


def for_path(exc: StagerError, path: str) -> StagerError:
    """A parent's error, once per file, naming the file (errors carry their details)."""
    return type(exc)(exc.message, **{**exc.details, "path": path})
