"""The check of a create, in either store (:func:`checked_create`), and of a put planned
without one (:func:`stager.meta.writes.plan_hinted`): the store that records it checks
its path there, and answers :class:`SpecChanged` where the directory layout the plan
assumed is not the one its file inherits."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...errors import AlreadyExists, IsADirectory, NotFound, StagerError
from ...protocol import paths
from ...protocol.models import LayoutSpec
from .base import CreateCheck, Upload


class SpecChanged(StagerError):
    """The layout its directory hands down is not the one the write was planned with
    (set since this server last saw it); nothing was recorded: the writer plans again
    with ``spec`` and writes again (never answered to a client as such)."""

    code = "layout_changed"
    status = 409

    def __init__(self, path: str, spec: LayoutSpec) -> None:
        super().__init__(f"the layout of {path}'s directory changed", path=path)
        self.spec = spec


def checked_spec(upload: Upload, found: LayoutSpec | StagerError) -> StagerError | None:
    """What a put of ``upload`` planned without a check answers, given the check's
    ``found`` (the error a create there raises, or the spec its directory hands down):
    the error, :class:`SpecChanged`, or None where it goes ahead."""
    if isinstance(found, StagerError):
        return found
    if upload.spec is not None and found != upload.spec:
        return SpecChanged(upload.path, found)
    return None


def check_replaceable(existing: Sequence[Any] | None, path: str, overwrite: bool) -> None:
    """Whether a new file may take ``path``, where ``existing`` is (its row or None)."""
    if existing is None:
        return
    if existing[1] == "directory":
        raise IsADirectory(f"{path} is a directory", path=path)
    if not overwrite:
        raise AlreadyExists(f"{path} already exists", path=path)


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
        return type(exc)(exc.message, **{**exc.details, "path": path})  # the file's own
    return spec
