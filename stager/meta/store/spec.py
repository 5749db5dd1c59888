"""A put planned without its check (:func:`stager.meta.writes.plan_hinted`): the store
that records it checks its path there, and answers :class:`SpecChanged` where the
directory layout the plan assumed is not the one its file inherits."""

from __future__ import annotations

from ...errors import StagerError
from ...protocol.models import LayoutSpec
from .base import Upload


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
