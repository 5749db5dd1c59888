"""The metadata store interface.  SQLite is the first implementation.

Every method is blocking and runs on the store's own thread (see
:class:`~stager.meta.service.MetaService`); implementations may assume one
caller at a time.  No SQL lives outside the implementations.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from ..errors import StagerError
from ..protocol.models import Layout, LayoutSpec, TargetInfo


@dataclass(frozen=True)
class NodeEntry:
    """A namespace entry as stored."""

    path: str
    kind: str                        # "file" or "directory"
    size: int = 0
    mtime: float = 0.0
    file_id: str | None = None
    layout: Layout | None = None     # files
    default_layout: LayoutSpec | None = None  # directories
    checksums: tuple[int, ...] | None = None

    @property
    def is_dir(self) -> bool:
        return self.kind == "directory"


@dataclass(frozen=True)
class Upload:
    """A write in progress: created, not yet committed."""

    file_id: str
    path: str
    layout: Layout
    overwrite: bool
    parents: bool
    created: float


@dataclass(frozen=True)
class Garbage:
    """Chunks of a deleted, replaced or abandoned file, waiting to be purged."""

    file_id: str
    layout: Layout
    size: int
    since: float


@dataclass(frozen=True)
class StoredFile:
    """A committed file as rebuild, repair and fsck see it: by id, without its path."""

    row: int                         # the store's row id; pages are ordered by it
    file_id: str
    size: int
    layout: Layout
    checksums: tuple[int, ...]


class MetaStore(ABC):
    # -- namespace -------------------------------------------------------------
    @abstractmethod
    def stat(self, path: str, *, checksums: bool = True) -> NodeEntry:
        """The entry at ``path``; NotFound / NotADirectory when it is not there."""

    @abstractmethod
    def list_dir(self, path: str, *, after: str, limit: int) -> list[NodeEntry]:
        """Up to ``limit`` children of a directory, by name, after ``after``."""

    @abstractmethod
    def mkdir(self, path: str, *, parents: bool, exist_ok: bool, now: float,
              layout: LayoutSpec | None = None) -> NodeEntry: ...

    @abstractmethod
    def set_layout(self, path: str, layout: LayoutSpec) -> NodeEntry: ...

    @abstractmethod
    def inherited_layout(self, path: str) -> LayoutSpec:
        """The default layout a new file at ``path`` inherits from its ancestors."""

    @abstractmethod
    def rename(self, src: str, dst: str, *, overwrite: bool, now: float) -> NodeEntry: ...

    @abstractmethod
    def remove(self, path: str, *, recursive: bool, now: float) -> int:
        """Remove a file or directory; returns how many files were removed."""

    @abstractmethod
    def counts(self) -> tuple[int, int, int]:
        """(files, directories, bytes) in the namespace."""

    @abstractmethod
    def subtree_files(self, path: str) -> dict[str, NodeEntry]:
        """Every file below directory ``path``, by path relative to it, with checksums."""

    # -- manifests ---------------------------------------------------------------
    @abstractmethod
    def put_manifest(self, path: str, body: bytes, *, now: float) -> None:
        """Attach a manifest to directory ``path`` (it goes when the directory goes)."""

    @abstractmethod
    def get_manifest(self, path: str) -> tuple[bytes, float]:
        """The manifest of directory ``path`` and when it was stored; NotFound if none."""

    # -- writes ----------------------------------------------------------------
    @abstractmethod
    def begin_upload(self, upload: Upload) -> None: ...

    @abstractmethod
    def get_upload(self, file_id: str) -> Upload: ...

    @abstractmethod
    def commit_upload(self, file_id: str, *, size: int, checksums: tuple[int, ...],
                      mtime: float, now: float) -> NodeEntry:
        """Make the upload visible at its path (replacing a file if allowed)."""

    @abstractmethod
    def abort_upload(self, file_id: str, *, now: float) -> None: ...

    # -- batched writes (stager/meta/batch.py): one transaction, one fsync per batch --
    @abstractmethod
    def check_creates(self, items: Sequence[tuple[str, bool, bool]]
                      ) -> list[LayoutSpec | StagerError]:
        """For each ``(path, overwrite, parents)``: the layout a new file there inherits,
        or why it cannot be created (what a single create checks)."""

    @abstractmethod
    def begin_uploads(self, uploads: Sequence[Upload]) -> None: ...

    @abstractmethod
    def get_uploads(self, file_ids: Sequence[str]) -> list[Upload | StagerError]: ...

    @abstractmethod
    def commit_uploads(self, items: Sequence[tuple[str, int, tuple[int, ...], float]], *,
                       now: float) -> list[NodeEntry | StagerError]:
        """Commit each ``(file_id, size, checksums, mtime)``; an item that fails changes
        nothing and does not stop the others."""

    @abstractmethod
    def abort_uploads(self, file_ids: Sequence[str], *, now: float
                      ) -> list[StagerError | None]: ...

    def group(self) -> AbstractContextManager[object]:
        """Run the operations inside in one transaction: one commit (one fsync) for all,
        each operation still failing alone.  A store that cannot group runs them as
        they come."""
        return nullcontext()

    @abstractmethod
    def expired_uploads(self, before: float) -> list[Upload]: ...

    @abstractmethod
    def take_garbage(self, limit: int) -> list[Garbage]: ...

    @abstractmethod
    def drop_garbage(self, file_ids: list[str]) -> None: ...

    # -- reliability (rebuild, repair, fsck) -------------------------------------
    @abstractmethod
    def file_by_id(self, file_id: str) -> StoredFile | None:
        """The committed file with this id, or ``None``."""

    @abstractmethod
    def path_of_file(self, file_id: str) -> str | None:
        """Where the committed file with this id is in the namespace, or ``None``."""

    @abstractmethod
    def files_page(self, *, after: int, limit: int,
                   targets: frozenset[str] | None = None) -> list[StoredFile]:
        """Committed files with row id above ``after``, in row order; only those whose
        layout names one of ``targets`` when given."""

    @abstractmethod
    def replace_layout(self, file_id: str, old: Layout, new: Layout) -> bool:
        """Swap a committed file's layout if it is still ``old``; False when it is not."""

    # -- targets ---------------------------------------------------------------
    @abstractmethod
    def upsert_target(self, target: TargetInfo) -> None: ...

    @abstractmethod
    def get_target(self, target_id: str) -> TargetInfo: ...

    @abstractmethod
    def list_targets(self) -> list[TargetInfo]: ...

    @abstractmethod
    def close(self) -> None: ...
