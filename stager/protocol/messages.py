"""The JSON bodies of the routes in :mod:`stager.protocol.routes`, one model each.

Servers parse a request with ``from_json`` and answer with ``to_json``; clients
build the request with the same model and read the answer with it, so a field
is named in one place.  Parsing is strict, as in :mod:`stager.protocol.models`:
a wrong type or a missing field is a :class:`~stager.errors.BadRequest`.  The
items of the writes (create, commit), each a batch, live in
:mod:`stager.protocol.batch`; the value objects they carry (layouts, file
infos, targets) in :mod:`stager.protocol.models`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..checksum import from_hex, to_hex
from ..errors import BadRequest
from .batch import parse_items
from .models import (
    FileInfo,
    Layout,
    LayoutSpec,
    ReadItem,
    TargetInfo,
    check_file_id,
    count_of,
    field_of,
)


# -- every server ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Health:
    """Liveness and identity: a data server also names its target (``id``) and node."""

    role: str
    version: str
    id: str | None = None
    node: str | None = None
    ok: bool = True

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok, "role": self.role, "version": self.version}
        out.update({k: v for k, v in (("id", self.id), ("node", self.node)) if v is not None})
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Health:
        return cls(field_of(obj, "role", str), field_of(obj, "version", str),
                   field_of(obj, "id", str, None), field_of(obj, "node", str, None),
                   field_of(obj, "ok", bool))


# -- metadata server: cluster --------------------------------------------------------------
SCRUB_STATES = ("idle", "running")


@dataclass(frozen=True)
class ScrubProgress:
    """A data server's background scrub: the pass running now (``bytes_total`` is the
    target's bytes when it began), or the last one (``finished``, unix time)."""

    state: str = "idle"
    passes: int = 0
    chunks_done: int = 0
    chunks_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0
    corrupt_found: int = 0
    started: float = 0.0
    finished: float = 0.0

    @property
    def bytes_remaining(self) -> int:
        return max(0, self.bytes_total - self.bytes_done) if self.state == "running" else 0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "bytes_remaining": self.bytes_remaining}

    @classmethod
    def from_json(cls, obj: Any) -> ScrubProgress:
        state = field_of(obj, "state", str, "idle")
        if state not in SCRUB_STATES:
            raise BadRequest(f"scrub state must be one of {SCRUB_STATES}")
        times = {k: float(field_of(obj, k, (int, float), 0.0)) for k in ("started", "finished")}
        return cls(state, **{k: count_of(obj, k, 0) for k in (
            "passes", "chunks_done", "chunks_total", "bytes_done", "bytes_total",
            "corrupt_found")}, **times)


@dataclass(frozen=True)
class Heartbeat:
    """What a data server reports of its target with every heartbeat.  ``bytes_read``
    and ``bytes_written``: chunk bytes served and stored since the data server started
    (counters; the metadata server turns successive ones into rates); ``scrub``: its
    background scrub's progress."""

    capacity: int = 0
    used: int = 0
    chunks: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    scrub: ScrubProgress | None = None

    def to_json(self) -> dict[str, Any]:
        body = {"capacity": self.capacity, "used": self.used, "chunks": self.chunks,
                "bytes_read": self.bytes_read, "bytes_written": self.bytes_written}
        return body if self.scrub is None else {**body, "scrub": self.scrub.to_json()}

    @classmethod
    def from_json(cls, obj: Any) -> Heartbeat:
        return cls(capacity=count_of(obj, "capacity", 0), used=count_of(obj, "used", 0),
                   chunks=count_of(obj, "chunks", 0),
                   bytes_read=count_of(obj, "bytes_read", 0),
                   bytes_written=count_of(obj, "bytes_written", 0),
                   scrub=None if obj.get("scrub") is None
                   else ScrubProgress.from_json(field_of(obj, "scrub", dict)))


@dataclass(frozen=True)
class TargetList:
    targets: tuple[TargetInfo, ...]

    def to_json(self) -> dict[str, Any]:
        return {"targets": [t.to_json() for t in self.targets]}

    @classmethod
    def from_json(cls, obj: Any) -> TargetList:
        return cls(tuple(TargetInfo.from_json(t) for t in field_of(obj, "targets", list)))


MIN_SCRUB_RATE = 64 * 1024


@dataclass(frozen=True)
class ScrubRequest:
    """Verify every chunk now, at most ``rate`` bytes a second (``None``: the default;
    0: no limit).  A rate below :data:`MIN_SCRUB_RATE` is refused: a scrub at a few
    bytes a second would hold the scrubber (and the request) for days."""

    rate: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"rate": self.rate} if self.rate is not None else {}

    @classmethod
    def from_json(cls, obj: Any) -> ScrubRequest:
        rate = count_of(obj, "rate", None)
        if rate and rate < MIN_SCRUB_RATE:
            raise BadRequest(f"rate must be 0 (no limit) or at least {MIN_SCRUB_RATE} bytes/s")
        return cls(rate)


@dataclass(frozen=True)
class ScrubReport:
    """A data server names the chunks of its target that failed verification."""

    target: str
    chunks: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "chunks": list(self.chunks)}

    @classmethod
    def from_json(cls, obj: Any) -> ScrubReport:
        chunks = field_of(obj, "chunks", list)
        if not all(isinstance(c, str) for c in chunks):
            raise BadRequest("chunks must be a list of chunk ids")
        return cls(field_of(obj, "target", str), tuple(chunks))


@dataclass(frozen=True)
class FsckRequest:
    repair: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"repair": self.repair}

    @classmethod
    def from_json(cls, obj: Any) -> FsckRequest:
        return cls(field_of(obj, "repair", bool, False))


# -- metadata server: namespace ------------------------------------------------------------
@dataclass(frozen=True)
class Listing:
    """One page of a directory; ``next`` is the ``after`` of the next page, or None.
    Without ``detail`` the entries carry only their path and type."""

    path: str
    entries: tuple[FileInfo, ...]
    next: str | None = None
    detail: bool = True

    def to_json(self) -> dict[str, Any]:
        entries = [e.to_json() if self.detail else {"path": e.path, "type": e.type}
                   for e in self.entries]
        return {"path": self.path, "entries": entries, "next": self.next}

    @classmethod
    def from_json(cls, obj: Any) -> Listing:
        return cls(path=field_of(obj, "path", str),
                   entries=tuple(FileInfo.from_json(e) for e in field_of(obj, "entries", list)),
                   next=field_of(obj, "next", str, None))


@dataclass(frozen=True)
class MkdirRequest:
    path: str
    parents: bool = False
    exist_ok: bool = False
    layout: LayoutSpec | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "parents": self.parents,
                               "exist_ok": self.exist_ok}
        if self.layout is not None:
            out["layout"] = self.layout.to_json()
        return out

    @classmethod
    def from_json(cls, obj: Any) -> MkdirRequest:
        path = field_of(obj, "path", str)
        layout = obj.get("layout")
        return cls(path=path, parents=field_of(obj, "parents", bool, False),
                   exist_ok=field_of(obj, "exist_ok", bool, False),
                   layout=LayoutSpec.from_json(layout) if layout else None)


@dataclass(frozen=True)
class SetLayoutRequest:
    path: str
    layout: LayoutSpec

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "layout": self.layout.to_json()}

    @classmethod
    def from_json(cls, obj: Any) -> SetLayoutRequest:
        return cls(field_of(obj, "path", str), LayoutSpec.from_json(field_of(obj, "layout", dict)))


@dataclass(frozen=True)
class Upload:
    """The answer to a create: where the new file's chunks go."""

    file_id: str
    path: str
    layout: Layout
    locations: dict[str, str]
    capability: str | None = None   # with auth on: a write capability for the file id

    def to_json(self) -> dict[str, Any]:
        out = {"file_id": self.file_id, "path": self.path, "layout": self.layout.to_json(),
               "locations": dict(self.locations)}
        if self.capability is not None:
            out["capability"] = self.capability
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Upload:
        return cls(file_id=check_file_id(field_of(obj, "file_id", str)),
                   path=field_of(obj, "path", str),
                   layout=Layout.from_json(field_of(obj, "layout", dict)),
                   locations=dict(field_of(obj, "locations", dict)),
                   capability=field_of(obj, "capability", str, None))


@dataclass(frozen=True)
class RerouteItem:
    """One upload with chunk writes that failed on a target, and how many chunks its
    writer has begun (the replacement picks the target that moves the fewest)."""

    file_id: str
    chunks: int

    def to_json(self) -> dict[str, Any]:
        return {"file_id": self.file_id, "chunks": self.chunks}

    @classmethod
    def from_json(cls, obj: Any) -> RerouteItem:
        chunks = field_of(obj, "chunks", int)
        if chunks < 0:
            raise BadRequest("chunks must not be negative")
        return cls(check_file_id(field_of(obj, "file_id", str)), chunks)


@dataclass(frozen=True)
class RerouteRequest:
    """Chunk writes to ``target`` failed (the error's wire ``code`` and its
    ``reason``): each upload gets a layout with another target in its slot; the
    target turns suspect only if it also fails the metadata server's probe, and is
    not probed when it was only full (route ``reroute``, stager/meta/suspicion.py)."""

    target: str
    code: str
    reason: str
    items: tuple[RerouteItem, ...]

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "code": self.code, "reason": self.reason,
                "items": [i.to_json() for i in self.items]}

    @classmethod
    def from_json(cls, obj: Any) -> RerouteRequest:
        reason = field_of(obj, "reason", str, "")
        return cls(field_of(obj, "target", str), field_of(obj, "code", str, ""), reason[:500],
                   tuple(parse_items(obj, RerouteItem.from_json, key=lambda i: i.file_id)))


@dataclass(frozen=True)
class RenameRequest:
    src: str
    dst: str
    overwrite: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "overwrite": self.overwrite}

    @classmethod
    def from_json(cls, obj: Any) -> RenameRequest:
        return cls(field_of(obj, "src", str), field_of(obj, "dst", str),
                   field_of(obj, "overwrite", bool, False))


@dataclass(frozen=True)
class RemoveRequest:
    path: str
    recursive: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "recursive": self.recursive}

    @classmethod
    def from_json(cls, obj: Any) -> RemoveRequest:
        return cls(field_of(obj, "path", str), field_of(obj, "recursive", bool, False))


@dataclass(frozen=True)
class RemoveResult:
    removed: int

    def to_json(self) -> dict[str, Any]:
        return {"removed": self.removed}

    @classmethod
    def from_json(cls, obj: Any) -> RemoveResult:
        return cls(field_of(obj, "removed", int))


@dataclass(frozen=True)
class ManifestStored:
    """The answer to recording a manifest: its directory and how many files it lists."""

    path: str
    files: int

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "files": self.files}

    @classmethod
    def from_json(cls, obj: Any) -> ManifestStored:
        return cls(field_of(obj, "path", str), field_of(obj, "files", int))


# -- data servers --------------------------------------------------------------------------
@dataclass(frozen=True)
class ReadRequest:
    """A batched read: the pieces, answered concatenated in this order."""

    items: tuple[ReadItem, ...]

    def to_json(self) -> dict[str, Any]:
        return {"items": [i.to_json() for i in self.items]}

    @classmethod
    def from_json(cls, obj: Any) -> ReadRequest:
        return cls(tuple(ReadItem.from_json(i) for i in field_of(obj, "items", list)))


@dataclass(frozen=True)
class ChunkStored:
    """The answer to storing one chunk: its size and CRC32C as read back from what the
    target stored, which the writer checks against its own (stager.dataplane.ack)."""

    chunk: str
    size: int
    crc: int

    def to_json(self) -> dict[str, Any]:
        return {"chunk": self.chunk, "size": self.size, "crc32c": to_hex(self.crc)}

    @classmethod
    def from_json(cls, obj: Any) -> ChunkStored:
        text = field_of(obj, "crc32c", str)
        try:
            crc = from_hex(text)
        except ValueError:
            raise BadRequest("crc32c must be 8 hex digits") from None
        return cls(field_of(obj, "chunk", str), field_of(obj, "size", int), crc)


@dataclass(frozen=True)
class ChunkBatchStored:
    """The answer to storing a chunk batch: how many chunks and bytes, and each chunk
    as :class:`ChunkStored` answers it."""

    chunks: int
    bytes: int
    stored: tuple[ChunkStored, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"chunks": self.chunks, "bytes": self.bytes,
                "stored": [c.to_json() for c in self.stored]}

    @classmethod
    def from_json(cls, obj: Any) -> ChunkBatchStored:
        return cls(field_of(obj, "chunks", int), field_of(obj, "bytes", int),
                   tuple(ChunkStored.from_json(c) for c in field_of(obj, "stored", list)))


@dataclass(frozen=True)
class ChunkDeleted:
    """Whether a chunk was there to delete."""

    deleted: bool

    def to_json(self) -> dict[str, Any]:
        return {"deleted": self.deleted}

    @classmethod
    def from_json(cls, obj: Any) -> ChunkDeleted:
        return cls(field_of(obj, "deleted", bool))


@dataclass(frozen=True)
class PurgeRequest:
    """Delete every chunk of these files."""

    file_ids: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"file_ids": list(self.file_ids)}

    @classmethod
    def from_json(cls, obj: Any) -> PurgeRequest:
        return cls(tuple(check_file_id(f) for f in field_of(obj, "file_ids", list)))
