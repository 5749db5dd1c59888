"""The answers of the metadata server's cluster and maintenance routes, one model each.

``status``, ``scrub``, ``scrub_report`` and ``fsck`` answer with these; the
client reads the same models back (strictly, as :mod:`stager.protocol.messages`
does) and hands their JSON on, which is what ``stager status --json``,
``stager scrub`` and ``stager fsck`` print.  Per-target details and the
listed chunks stay plain JSON objects inside the model: they are shown to an
operator, never acted on by a program.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import BadRequest
from .models import TargetInfo, field_of

_NUMBER = (int, float)


def _objects(obj: Any, key: str) -> tuple[dict[str, Any], ...]:
    """A list of JSON objects (a listed chunk, say), checked to be objects."""
    items = field_of(obj, key, list)
    if not all(isinstance(i, dict) for i in items):
        raise BadRequest(f"field {key!r} must be a list of objects")
    return tuple(items)


@dataclass(frozen=True)
class MetaServer:
    """One metadata server of the store, as the one answering last heard of it:
    ``state`` is ``up``, or ``down`` once not seen for a few intervals (or stopped);
    ``duties`` says whether it runs the background duties (GC, rebuild, fsck)."""

    url: str
    store: str
    state: str
    duties: bool
    last_seen: float

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "store": self.store, "state": self.state,
                "duties": self.duties, "last_seen": self.last_seen}

    @classmethod
    def from_json(cls, obj: Any) -> MetaServer:
        return cls(url=field_of(obj, "url", str), store=field_of(obj, "store", str),
                   state=field_of(obj, "state", str), duties=field_of(obj, "duties", bool),
                   last_seen=field_of(obj, "last_seen", _NUMBER))


@dataclass(frozen=True)
class Status:
    """The cluster at a glance.  ``metas`` are the metadata servers of the store;
    ``lost_at`` says, for each down target, when it will be declared lost (its
    rebuild then starts).  ``sections`` are the parts the background services
    add (rebuild, repair, fsck, lost targets), keyed by their name on the wire."""

    targets: tuple[TargetInfo, ...]
    nodes: int
    targets_up: int
    capacity: int
    used: int
    files: int
    directories: int
    bytes: int
    sections: dict[str, Any] = field(default_factory=dict)
    metas: tuple[MetaServer, ...] = ()
    lost_at: dict[str, float] = field(default_factory=dict)

    _CORE = ("nodes", "targets_up", "capacity", "used", "files", "directories", "bytes")
    _TYPED = ("targets", "metas", "lost_at")

    def to_json(self) -> dict[str, Any]:
        return {"targets": [t.to_json() for t in self.targets],
                **{k: getattr(self, k) for k in self._CORE},
                "metas": [m.to_json() for m in self.metas], "lost_at": dict(self.lost_at),
                **self.sections}

    @classmethod
    def from_json(cls, obj: Any) -> Status:
        targets = tuple(TargetInfo.from_json(t) for t in field_of(obj, "targets", list))
        core = {k: field_of(obj, k, int) for k in cls._CORE}
        metas = tuple(MetaServer.from_json(m) for m in field_of(obj, "metas", list, ()))
        lost_at = field_of(obj, "lost_at", dict, {})
        if not all(isinstance(v, _NUMBER) and not isinstance(v, bool)
                   for v in lost_at.values()):
            raise BadRequest("field 'lost_at' must map target ids to times")
        sections = {k: v for k, v in obj.items() if k not in cls._TYPED and k not in core}
        return cls(targets=targets, sections=sections, metas=metas, lost_at=dict(lost_at),
                   **core)


@dataclass(frozen=True)
class ScrubQueued:
    """The answer to a data server's scrub report: how many chunks were newly queued."""

    queued: int

    def to_json(self) -> dict[str, Any]:
        return {"queued": self.queued}

    @classmethod
    def from_json(cls, obj: Any) -> ScrubQueued:
        return cls(field_of(obj, "queued", int))


@dataclass(frozen=True)
class ScrubResult:
    """What a cluster scrub found and did.  ``targets`` holds each target's own
    figures (or its ``error``); the counts are over all of them, and each corrupt
    chunk counts once as repaired, unrecoverable, deferred or ignored."""

    targets: dict[str, dict[str, Any]]
    checked: int
    bytes: int
    corrupt: int
    repaired: int
    unrecoverable: int
    deferred: int
    ignored: int
    unreachable: Sequence[str]
    seconds: float

    _COUNTS = ("checked", "bytes", "corrupt", "repaired", "unrecoverable", "deferred",
               "ignored")

    def to_json(self) -> dict[str, Any]:
        return {"targets": dict(self.targets), **{k: getattr(self, k) for k in self._COUNTS},
                "unreachable": list(self.unreachable), "seconds": self.seconds}

    @classmethod
    def from_json(cls, obj: Any) -> ScrubResult:
        return cls(targets=dict(field_of(obj, "targets", dict)),
                   unreachable=tuple(field_of(obj, "unreachable", list)),
                   seconds=field_of(obj, "seconds", _NUMBER),
                   **{k: field_of(obj, k, int) for k in cls._COUNTS})


@dataclass(frozen=True)
class FsckResult:
    """The namespace against the chunks (see :mod:`stager.meta.upkeep.fsck`): counts, and
    the first missing (``file_id``, ``chunk``, ``target``, ``path``) and orphan
    (``target``, ``chunk``) copies."""

    files: int
    chunks_expected: int
    chunks_found: int
    missing: int
    missing_list: Sequence[dict[str, Any]]
    orphans: int
    orphan_list: Sequence[dict[str, Any]]
    unreachable: Sequence[str]
    under_replicated: int
    repaired: int
    orphans_deleted: int
    clean: bool
    seconds: float

    _COUNTS = ("files", "chunks_expected", "chunks_found", "missing", "orphans",
               "under_replicated", "repaired", "orphans_deleted")

    def to_json(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self._COUNTS},
                "missing_list": list(self.missing_list), "orphan_list": list(self.orphan_list),
                "unreachable": list(self.unreachable), "clean": self.clean,
                "seconds": self.seconds}

    @classmethod
    def from_json(cls, obj: Any) -> FsckResult:
        return cls(missing_list=_objects(obj, "missing_list"),
                   orphan_list=_objects(obj, "orphan_list"),
                   unreachable=tuple(field_of(obj, "unreachable", list)),
                   clean=field_of(obj, "clean", bool), seconds=field_of(obj, "seconds", _NUMBER),
                   **{k: field_of(obj, k, int) for k in cls._COUNTS})
