"""The metadata store: the one interface a store implements, SQLite and PostgreSQL.

Every method the metadata service and its background duties (garbage
collection, rebuild, repair, fsck) need, as coroutines, so that a store may wait
on a network database without a thread (PostgreSQL) or run blocking SQL on a
thread of its own (:class:`~stager.meta.store.sqlite.store.SQLiteStore`).  No SQL
lives outside the implementations.  The methods are grouped by role into small
interfaces that :class:`MetaStore` joins: :class:`Namespace`, :class:`Uploads`,
:class:`Collection`, :class:`FileIndex`, :class:`TokenStore`, :class:`Registry`,
:class:`Copying`, :class:`SharedState`, :class:`Answers`, :class:`Quotas`,
:class:`Pins`, :class:`Caching`, :class:`Multipart` and :class:`S3Keys`; a part of the server
that needs one role takes that role's type.

What every implementation guarantees:

* **atomic**: each call happens entirely or not at all (one transaction);
* **durable when answered**: a write whose await has returned is committed
  (on disk, or on the database server) and survives a crash;
* **in order**: a call sees every write answered before it was made;
* **errors** are those of :mod:`stager.errors` (NotFound, AlreadyExists, …);
  the writes take a batch (one item or many) and answer each item's error in its
  place.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import StagerError
from ...protocol import paths
from ...protocol.authmsg import TokenInfo
from ...protocol.models import Layout, LayoutSpec, TargetInfo
from ...protocol.quotas import Pin, Quota
from .caching import Caching
from .multipart import Multipart
from .records import EntryRecord, ManifestRecord
from .s3keys import S3Keys
from .servers import Answers, SharedState


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
    attrs: dict[str, Any] = field(default_factory=dict)  # files: the version's attributes

    @property
    def is_dir(self) -> bool:
        return self.kind == "directory"


@dataclass(frozen=True)
class Upload:
    """A write in progress: created, not yet committed.  ``spec``: the directory layout
    its plan assumed unchecked (writes.plan_hinted), checked where it is recorded."""
    file_id: str
    path: str
    layout: Layout
    overwrite: bool
    parents: bool
    created: float
    spec: LayoutSpec | None = field(default=None, compare=False)


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


@dataclass(frozen=True)
class ManifestVersion:
    """Which manifest a directory has and how far its resolution has changed: the
    directory's row, the manifest's ``gen`` (bumped, in the same transaction, by every
    change visible to the manifest's resolution: a commit, remove or rename below the
    directory, a layout replaced by rebuild, the manifest stored again) and when it was
    stored (so that a row id a new directory reuses never matches an old manifest)."""

    dir_id: int
    gen: int
    created: float


# A child in a listing: NodeEntry's fields in order (``NodeEntry(*row)``), a cheap tuple.
Listed = tuple[str, str, int, float, str | None, Layout | None, LayoutSpec | None,
               tuple[int, ...] | None, dict[str, Any]]


def listed_of(e: NodeEntry) -> Listed:
    """``e`` as its :data:`Listed` tuple (``NodeEntry(*listed_of(e)) == e``)."""
    return (e.path, e.kind, e.size, e.mtime, e.file_id, e.layout, e.default_layout,
            e.checksums, e.attrs)


CreateCheck = tuple[str, bool, bool]    # (path, overwrite, parents) of a file to create
# (file_id, size, checksums, mtime[, attrs]) of one upload to commit; attrs: the version's
Committing = tuple[str, int, tuple[int, ...], float, dict[str, Any]]
CommitArgs = tuple[str, int, tuple[int, ...], float] | Committing


def committing(item: CommitArgs) -> Committing:
    return item if len(item) == 5 else (*item, {})  # type: ignore[return-value]


class Namespace(ABC):
    """The tree of directories and committed files, and dataset manifests."""

    # -- namespace -------------------------------------------------------------
    @abstractmethod
    async def stat(self, path: str, *, checksums: bool = True) -> NodeEntry:
        """The entry at ``path``; NotFound / NotADirectory when it is not there."""

    async def stat_row(self, path: str) -> Listed:
        """:meth:`stat` as a :data:`Listed` tuple (the server writes a stat's answer
        straight from it, as a listing page's entries)."""
        return listed_of(await self.stat(path))

    @abstractmethod
    async def list_rows(self, path: str, *, after: str, limit: int) -> list[Listed]:
        """Up to ``limit`` children of a directory, by name, after ``after``: each a
        :data:`Listed` tuple (a listing page is built from these, no object per row)."""

    async def list_dir(self, path: str, *, after: str, limit: int) -> list[NodeEntry]:
        """:meth:`list_rows` as entries."""
        return [NodeEntry(*row) for row in await self.list_rows(path, after=after, limit=limit)]

    @abstractmethod
    async def mkdir(self, path: str, *, parents: bool, exist_ok: bool, now: float,
                    layout: LayoutSpec | None = None) -> NodeEntry:
        """Create a directory (and its parents with ``parents``), with a default layout
        for the files below it."""

    @abstractmethod
    async def set_layout(self, path: str, layout: LayoutSpec) -> NodeEntry:
        """Set the default layout of directory ``path`` (an empty spec clears it)."""

    @abstractmethod
    async def rename(self, src: str, dst: str, *, overwrite: bool, now: float) -> NodeEntry:
        """Move ``src`` to ``dst`` atomically: a reader sees it at one of the two, never
        at both or neither.  A file replaced at ``dst`` goes to garbage in the same
        transaction."""

    @abstractmethod
    async def remove(self, path: str, *, recursive: bool, now: float) -> int:
        """Remove a file or directory (its files go to garbage in the same transaction);
        returns how many files were removed."""

    @abstractmethod
    async def counts(self) -> tuple[int, int, int]:
        """(files, directories, bytes) in the namespace."""

    @abstractmethod
    async def subtree_files(self, path: str) -> dict[str, NodeEntry]:
        """Every file below directory ``path``, by path relative to it, with checksums."""

    # -- manifests ---------------------------------------------------------------
    @abstractmethod
    async def put_manifest(self, path: str, body: bytes, *, now: float) -> None:
        """Attach a manifest to directory ``path`` (it goes when the directory goes)."""

    @abstractmethod
    async def get_manifest(self, path: str) -> tuple[bytes, float]:
        """The manifest of directory ``path`` and when it was stored; NotFound if none."""

    @abstractmethod
    async def manifest_version(self, path: str) -> ManifestVersion:
        """The version of the manifest of directory ``path``, in one query (a cache of
        resolved manifests checks it on every request); NotFound if none."""


class Uploads(ABC):
    """Writes: uploads begun, committed or aborted; each call a batch, one item or many
    (:mod:`stager.meta.writes`).  ``in_order``: the store runs calls one at a time in
    the order they were made, so a commit made right behind a begin sees its upload."""
    in_order = False

    @abstractmethod
    async def check_creates(self, items: Sequence[CreateCheck]
                            ) -> list[LayoutSpec | StagerError]:
        """For each ``(path, overwrite, parents)``: the default layout a new file there
        inherits (the nearest directory's, field by field), or the error a create
        there raises.  Reads only."""

    @abstractmethod
    async def begin_uploads(self, uploads: Sequence[Upload]) -> None:
        """Record writes in progress, in one transaction; nothing of them is visible in
        the namespace.  Need not be flushed when answered: a pending upload lost in a
        crash loses nothing promised (its commit fails, marked ``never_committed``)."""

    @abstractmethod
    async def get_uploads(self, file_ids: Sequence[str]) -> list[Upload | StagerError]:
        """Each pending upload, or UploadNotFound in its place when there is none."""

    @abstractmethod
    async def commit_uploads(self, items: Sequence[CommitArgs], *,
                             now: float) -> list[NodeEntry | StagerError]:
        """Make each upload ``(file_id, size, checksums, mtime, attrs)`` visible at its path,
        in one transaction: a file is visible only after this.  A file it replaces (if
        the upload allows) goes to garbage in the same transaction; missing parents are
        made if the upload allows.  An item that fails changes nothing and does not
        stop the others: its error is in its place; but an item refused by a quota
        (QuotaExceeded, final) has its upload dropped as :meth:`abort_uploads` does, so
        its chunks are collected at once."""

    @abstractmethod
    async def abort_uploads(self, file_ids: Sequence[str], *, now: float
                            ) -> list[StagerError | None]:
        """Drop each pending upload (its chunks go to garbage) in one transaction;
        ``None`` where it went, the error in its place where not."""

    @abstractmethod
    async def replace_upload_layout(self, file_id: str, old: Layout, new: Layout) -> bool:
        """Compare-and-swap: set a pending upload's layout to ``new`` if it is still
        ``old`` (a writer routing around a failed target); False, changing nothing,
        when it is not or the upload is gone."""


class Collection(ABC):
    """What garbage collection takes: expired uploads, replaced and removed files' chunks."""

    @abstractmethod
    async def expired_uploads(self, before: float) -> list[Upload]:
        """Pending uploads begun before ``before`` (``inf``: all of them)."""

    @abstractmethod
    async def take_garbage(self, limit: int) -> list[Garbage]:
        """Up to ``limit`` files waiting to be purged, oldest first (they stay listed
        until :meth:`drop_garbage`)."""

    @abstractmethod
    async def drop_garbage(self, file_ids: list[str], *, now: float, forget_before: float
                           ) -> None:
        """Forget garbage whose chunks are purged at ``now``: each id stays
        :meth:`retired` (a purged id), and the purged ids older than ``forget_before``
        go."""

    @abstractmethod
    async def retired(self, file_id: str) -> bool:
        """Whether ``file_id`` was a file removed or replaced, or an upload abandoned:
        garbage, or purged and not yet forgotten (:meth:`drop_garbage`).  A retried commit
        whose upload is gone and whose file is not in the namespace asks this: when
        the id was never retired, no try committed it (stager/meta/opkey.py)."""


class FileIndex(ABC):
    """Committed files by id and by target: rebuild, repair and fsck
    (:mod:`stager.meta.upkeep`)."""

    @abstractmethod
    async def file_by_id(self, file_id: str) -> StoredFile | None:
        """The committed file with this id, or ``None``."""

    @abstractmethod
    async def path_of_file(self, file_id: str) -> str | None:
        """Where the committed file with this id is in the namespace, or ``None``."""

    @abstractmethod
    async def files_page(self, *, after: int, limit: int,
                         targets: frozenset[str] | None = None) -> list[StoredFile]:
        """Committed files with row id above ``after``, in row order; only those whose
        layout names one of ``targets`` when given."""

    @abstractmethod
    async def replace_layout(self, file_id: str, old: Layout, new: Layout) -> bool:
        """Compare-and-swap: set a committed file's layout to ``new`` if it is still
        ``old``; False when it is not (the file was replaced, removed or rebuilt
        meanwhile), and then nothing changes."""


class TokenStore(ABC):
    """Minted tokens (:mod:`stager.meta.auth`), and the credentials pinned to targets
    (:mod:`stager.meta.targetauth`)."""

    # -- tokens (stager/meta/auth.py) ------------------------------------------------
    @abstractmethod
    async def put_token(self, info: TokenInfo) -> None:
        """Record a token minted (never its text)."""

    @abstractmethod
    async def list_tokens(self) -> list[TokenInfo]:
        """Every token recorded, oldest first."""

    @abstractmethod
    async def revoke_token(self, token_id: str, *, now: int) -> TokenInfo:
        """Mark a token revoked (at ``now``; kept if already revoked); its record, or
        :class:`~stager.errors.NotFound`."""

    @abstractmethod
    async def take_token_use(self, token_id: str) -> bool:
        """Spend one of a token's limited uses, atomically: False when none is left
        (or no such token); True, spending nothing, for a token without a limit."""

    # -- target credentials (stager/meta/targetauth.py) --------------------------------
    @abstractmethod
    async def target_credential(self, target_id: str) -> str | None:
        """The id of the credential pinned to ``target_id``, if one is."""

    @abstractmethod
    async def pin_target_credential(self, target_id: str, token_id: str, *,
                                    replaces: str | None) -> bool:
        """Compare-and-swap: pin ``token_id`` to ``target_id`` if the pin is still
        ``replaces`` (``None``: no pin yet); False, changing nothing, when it is not."""

    @abstractmethod
    async def forget_target(self, target_id: str) -> None:
        """Drop a target's record and its credential's pin (``stager target forget``)."""


class Registry(ABC):
    """The storage targets: their records and heartbeats."""

    @abstractmethod
    async def upsert_target(self, target: TargetInfo) -> None:
        """Register a target, or update its stored record."""

    @abstractmethod
    async def list_targets(self) -> list[TargetInfo]:
        """Every registered target, by id."""

    async def touch_target(self, target: TargetInfo) -> None:
        """Store a heartbeat: ``target``'s capacity, use, chunks, last heartbeat and
        state, except that a stored ``removed`` state stays (an operator's word is
        not undone by a heartbeat another metadata server had not heard of)."""
        await self.upsert_target(target)

    async def touch_targets(self, targets: Sequence[TargetInfo]) -> None:
        """Store many heartbeats as :meth:`touch_target` stores one (a target named
        twice: its last).  A shared store takes them in one transaction: a data
        server's batch then costs one round trip, not one per target."""
        for target in targets:
            await self.touch_target(target)


class Copying(ABC):
    """A whole store page by page, out and in (:mod:`stager.meta.store.migrate`)."""

    @abstractmethod
    async def dump_entries(self, *, after: int, limit: int) -> list[EntryRecord]:
        """Up to ``limit`` namespace entries (the root included) with row id above
        ``after``, in row order."""

    @abstractmethod
    async def load_entries(self, records: Sequence[EntryRecord]) -> None:
        """Insert entries with their own row ids, in one transaction; the root's
        record sets the root's mtime and default layout.  For filling an empty store:
        an entry whose row id or ``(parent, name)`` is taken fails the whole call."""

    @abstractmethod
    async def dump_manifests(self, *, after: int, limit: int) -> list[ManifestRecord]:
        """Up to ``limit`` manifests on directories with row id above ``after``, in row
        order."""

    @abstractmethod
    async def load_manifests(self, records: Sequence[ManifestRecord]) -> None:
        """Insert manifests (their directories loaded before), in one transaction."""

    @abstractmethod
    async def dump_garbage(self, *, after: str, limit: int) -> list[Garbage]:
        """Up to ``limit`` files waiting to be purged with file id above ``after``, by
        file id."""

    @abstractmethod
    async def load_garbage(self, items: Sequence[Garbage]) -> None:
        """Add files waiting to be purged (one already there is kept), in one
        transaction."""


class Quotas(ABC):
    """Directory quotas (:mod:`stager.meta.quotas`): each quota directory keeps its
    subtree's use, changed in the transaction of every commit, remove and rename
    below it, so a write that would pass a limit fails with
    :class:`~stager.errors.QuotaExceeded` and changes nothing."""

    @abstractmethod
    async def set_quota(self, path: str, *, max_bytes: int | None,
                        max_files: int | None) -> Quota:
        """Set the limits of directory ``path`` (both ``None``: no quota) and count its
        use from its subtree, in one transaction; the quota as now stored."""

    @abstractmethod
    async def list_quotas(self) -> list[Quota]:
        """Every quota with its use, by path."""


class Pins(ABC):
    """Paths pinned: never evicted from the fast tier, until unpinned or expired."""

    @abstractmethod
    async def pin(self, path: str, *, expires: float | None, now: float) -> Pin:
        """Pin the file or directory at ``path`` (NotFound when there is none) until
        ``expires`` (``None``: until unpinned); pinning again replaces the expiry."""

    @abstractmethod
    async def unpin(self, path: str) -> None:
        """Drop the pin on ``path``; NotFound when it has none."""

    @abstractmethod
    async def pins(self, now: float) -> list[Pin]:
        """Every pin not expired at ``now``, by path (expired ones are dropped)."""

    async def is_pinned(self, path: str, now: float) -> bool:
        """Whether ``path`` or a directory above it holds a pin alive at ``now``."""
        path = paths.normalize(path)
        return any(paths.is_within(path, p.path) for p in await self.pins(now))


class MetaStore(Namespace, Uploads, Collection, FileIndex, TokenStore, Registry, Copying,
                SharedState, Answers, Quotas, Pins, Caching, Multipart, S3Keys):
    """Every role above: what a store implements.  A part of the server that needs one
    role takes that role's type (the auth tables take a :class:`TokenStore`).  Used
    from one event loop; calls may overlap (the service does not wait for one to
    finish before making the next), and each still has the guarantees above."""

    @abstractmethod
    def close(self) -> None:
        """Finish what is under way and release the store (once, at shutdown)."""


async def all_files(store: MetaStore, *, page: int = 1000,
                    targets: frozenset[str] | None = None) -> AsyncIterator[StoredFile]:
    """Every committed file (whose layout names one of ``targets`` when given), in
    row order, one :meth:`MetaStore.files_page` at a time."""
    after = 0
    while True:
        files = await store.files_page(after=after, limit=page, targets=targets)
        for f in files:
            yield f
        if len(files) < page:
            return
        after = files[-1].row
