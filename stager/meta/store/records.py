"""What a whole-store copy (:mod:`stager.meta.store.migrate`) reads and writes: rows
exactly as stored, with their row ids."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...protocol.models import Layout, LayoutSpec


@dataclass(frozen=True)
class EntryRecord:
    """One namespace entry exactly as stored, for copying a whole namespace
    (:mod:`stager.meta.store.migrate`): its row id and its parent's row id (the root is
    row 1, with parent 0), so a copy keeps the tree, and the row order, as it was."""

    row: int
    parent: int
    name: str
    kind: str                        # "file" or "directory"
    size: int
    mtime: float
    file_id: str | None = None
    layout: Layout | None = None     # files
    default_layout: LayoutSpec | None = None  # directories
    checksums: tuple[int, ...] = ()
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ManifestRecord:
    """A manifest as stored: on the directory of row ``dir_row``."""

    dir_row: int
    body: bytes
    created: float
