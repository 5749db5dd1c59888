"""The bodies of the cache routes: attach, refresh, detach, and fills (``stager attach``).

An attached directory shows the files of a source URL (any fsspec URL); their bytes
are fetched chunk by chunk on first read by the metadata server (a *fill*) and kept
in the striped tier.  A reader asks for the chunks it is about to read with one
fill request per read plan; the answer is each chunk's CRC32C once it is filled,
so a read of cached chunks costs that one round trip and never touches the source.
The source's storage options go to the metadata server once, with the attach; they
are stored encrypted and never sent back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import BadRequest
from .models import FILE_ID_RE, INT64_MAX, count_of, field_of

MAX_GLOBS = 64                  # --include / --exclude each
MAX_OPTIONS_BYTES = 16 << 10    # storage options, as JSON
MIN_REFRESH = 1.0               # seconds
SOURCE_PROTOCOLS = ("file", "http", "https", "s3", "s3a", "gs", "gcs", "memory")
_NUMBER = (int, float)
MAX_FILLED_ANSWERED = 1 << 18   # CRC32Cs a plan registration answers (a client keeps as many)


def _globs(obj: Any, key: str) -> tuple[str, ...]:
    globs = field_of(obj, key, list, [])
    if len(globs) > MAX_GLOBS or not all(isinstance(g, str) and g and "\0" not in g
                                         for g in globs):
        raise BadRequest(f"field {key!r} must be a list of at most {MAX_GLOBS} "
                         "non-empty globs")
    return tuple(globs)


def check_source(url: str) -> str:
    """``url`` if it names a source protocol an attachment may use, else BadRequest."""
    protocol, sep, rest = url.partition("://")
    if not sep or protocol not in SOURCE_PROTOCOLS or not rest.strip("/") \
            or "\0" in url or "::" in url:
        raise BadRequest(f"source {url!r} must be a URL of one of "
                         f"{', '.join(SOURCE_PROTOCOLS)} naming a directory below its root",
                         source=url)
    return url


@dataclass(frozen=True)
class AttachRequest:
    """Attach (or re-attach) a directory to ``source``."""

    source: str
    refresh: float | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)   # fsspec storage options

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "refresh": self.refresh, "include": list(self.include),
                "exclude": list(self.exclude), "options": self.options}

    @classmethod
    def from_json(cls, obj: Any) -> AttachRequest:
        refresh = field_of(obj, "refresh", _NUMBER, None)
        if refresh is not None and not MIN_REFRESH <= refresh <= INT64_MAX:
            raise BadRequest(f"field 'refresh' must be at least {MIN_REFRESH} seconds")
        options = field_of(obj, "options", dict, {})
        if not all(isinstance(k, str) for k in options):
            raise BadRequest("field 'options' must be an object of storage options")
        return cls(check_source(field_of(obj, "source", str)), refresh,
                   _globs(obj, "include"), _globs(obj, "exclude"), options)


@dataclass(frozen=True)
class Attachment:
    """An attached directory as ``stager status`` and ``GET /v1/attachments`` show it."""

    path: str
    source: str
    refresh: float | None
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    listed: float
    files: int = 0
    bytes: int = 0                  # the files' total size
    cached_bytes: int = 0           # of which filled
    cached_chunks: int = 0
    hits: int = 0
    misses: int = 0

    @property
    def hit_ratio(self) -> float | None:
        reads = self.hits + self.misses
        return self.hits / reads if reads else None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "source": self.source, "refresh": self.refresh,
                "include": list(self.include), "exclude": list(self.exclude),
                "listed": self.listed, "files": self.files, "bytes": self.bytes,
                "cached_bytes": self.cached_bytes, "cached_chunks": self.cached_chunks,
                "hits": self.hits, "misses": self.misses, "hit_ratio": self.hit_ratio}

    @classmethod
    def from_json(cls, obj: Any) -> Attachment:
        return cls(field_of(obj, "path", str), field_of(obj, "source", str),
                   field_of(obj, "refresh", _NUMBER, None), _globs(obj, "include"),
                   _globs(obj, "exclude"), float(field_of(obj, "listed", _NUMBER, 0.0)),
                   count_of(obj, "files", 0), count_of(obj, "bytes", 0),
                   count_of(obj, "cached_bytes", 0), count_of(obj, "cached_chunks", 0),
                   count_of(obj, "hits", 0), count_of(obj, "misses", 0))


@dataclass(frozen=True)
class AttachmentList:
    attachments: tuple[Attachment, ...]

    def to_json(self) -> dict[str, Any]:
        return {"attachments": [a.to_json() for a in self.attachments]}

    @classmethod
    def from_json(cls, obj: Any) -> AttachmentList:
        return cls(tuple(Attachment.from_json(a) for a in field_of(obj, "attachments", list)))


@dataclass(frozen=True)
class Refreshed:
    """What a listing of the source changed: files new, changed (their cached bytes
    dropped), gone (404 from now on), and unchanged."""

    attachment: Attachment
    added: int = 0
    changed: int = 0
    removed: int = 0
    unchanged: int = 0
    refused: int = 0                # files that could not be shown (a quota, a user's file)
    errors: tuple[str, ...] = ()    # why, for the first few of them

    def to_json(self) -> dict[str, Any]:
        return {"attachment": self.attachment.to_json(), "added": self.added,
                "changed": self.changed, "removed": self.removed, "unchanged": self.unchanged,
                "refused": self.refused, "errors": list(self.errors)}

    @classmethod
    def from_json(cls, obj: Any) -> Refreshed:
        return cls(Attachment.from_json(field_of(obj, "attachment", dict)),
                   count_of(obj, "added", 0), count_of(obj, "changed", 0),
                   count_of(obj, "removed", 0), count_of(obj, "unchanged", 0),
                   count_of(obj, "refused", 0),
                   tuple(str(e) for e in field_of(obj, "errors", list, [])))


@dataclass(frozen=True)
class Detached:
    path: str
    files: int                      # files the view had
    chunks: int                     # cached chunks freed

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "files": self.files, "chunks": self.chunks}

    @classmethod
    def from_json(cls, obj: Any) -> Detached:
        return cls(field_of(obj, "path", str), count_of(obj, "files"), count_of(obj, "chunks"))


@dataclass(frozen=True)
class FillItem:
    """Chunks ``chunks`` of cached file ``file_id`` are about to be read; ``again``:
    those of them that no replica had (evicted, or lost): fetched anew."""

    file_id: str
    chunks: tuple[int, ...]
    again: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file_id": self.file_id, "chunks": list(self.chunks)}
        if self.again:
            out["again"] = list(self.again)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> FillItem:
        file_id = field_of(obj, "file_id", str)
        if not FILE_ID_RE.fullmatch(file_id):
            raise BadRequest(f"invalid file id {file_id!r}")
        chunks = field_of(obj, "chunks", list)
        again = field_of(obj, "again", list, [])
        for c in (*chunks, *again):
            if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c < 1 << 32:
                raise BadRequest("chunk indexes must be integers from 0 to 2**32 - 1")
        if not set(again) <= set(chunks):
            raise BadRequest("field 'again' must name chunks of field 'chunks'")
        return cls(file_id, tuple(chunks), tuple(again))


@dataclass(frozen=True)
class Filled:
    """The CRC32C of each chunk asked for, in the order asked; ``fetched``: those of
    them (indexes) that were not cached and came from the source for this request."""

    crc: tuple[int, ...]
    fetched: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"crc": [f"{c:08x}" for c in self.crc], "fetched": list(self.fetched)}

    @classmethod
    def from_json(cls, obj: Any) -> Filled:
        return cls(tuple(int(c, 16) for c in field_of(obj, "crc", list)),
                   tuple(int(c) for c in field_of(obj, "fetched", list, [])))


@dataclass(frozen=True)
class ReadsCounted:
    """The answer to a report of reads (route ``cache_reads``): the chunks counted."""

    chunks: int

    def to_json(self) -> dict[str, Any]:
        return {"chunks": self.chunks}

    @classmethod
    def from_json(cls, obj: Any) -> ReadsCounted:
        return cls(count_of(obj, "chunks"))


MAX_PLAN_TTL = 86400.0          # seconds a plan registration lives unless renewed
PLAN_ID_RE = re.compile(r"[0-9a-f]{8,64}")


def check_plan_id(text: str) -> str:
    if not PLAN_ID_RE.fullmatch(text):
        raise BadRequest(f"invalid plan id {text!r}: 8 to 64 hex digits")
    return text


KnownCrcs = dict[str, dict[int, int]]     # CRC32Cs of filled chunks: file id -> index -> crc


def filled_json(filled: KnownCrcs) -> list[dict[str, Any]]:
    return [{"file_id": f, "chunks": list(crcs), "crc": [f"{c:08x}" for c in crcs.values()]}
            for f, crcs in filled.items()]


def filled_of(obj: Any) -> KnownCrcs:
    """The ``filled`` field of an answer (see :class:`PlanRegistered`); none: empty."""
    out: KnownCrcs = {}
    for item in field_of(obj, "filled", list, []):
        chunks, crcs = field_of(item, "chunks", list), field_of(item, "crc", list)
        if len(chunks) != len(crcs):
            raise BadRequest("a filled file's chunks and crc differ in length")
        try:
            out[field_of(item, "file_id", str)] = {
                int(i): int(c, 16) for i, c in zip(chunks, crcs, strict=True)}
        except (TypeError, ValueError):
            raise BadRequest("a filled file's chunks are integers, its crc hex") from None
    return out


@dataclass(frozen=True)
class PlanPosition:
    """Where rank ``rank`` of a registered plan's job reads: the batch at ``cursor`` of
    ``epoch`` (a Loader's position, moved on by its prefetch).  ``learn``: the answer
    names the CRC32Cs of the plan's chunks filled now (``filled``, as a registration's
    answer does for rank 0): a rank's client asks once."""

    epoch: int
    cursor: int
    rank: int = 0
    learn: bool = False
    filled: KnownCrcs = field(default_factory=dict)     # in an answer to ``learn``

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"epoch": self.epoch, "cursor": self.cursor, "rank": self.rank}
        if self.learn:
            out["learn"] = True
        if self.filled:
            out["filled"] = filled_json(self.filled)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> PlanPosition:
        rank = count_of(obj, "rank", 0)
        if rank >= 1 << 20:
            raise BadRequest("field 'rank' must be below 2**20")
        return cls(count_of(obj, "epoch"), count_of(obj, "cursor"), rank,
                   field_of(obj, "learn", bool, False), filled_of(obj))


@dataclass(frozen=True)
class PlanRequest:
    """A Loader's epoch plan as parameters (``plan``: see
    :meth:`stager.plans.registered.Plan.from_dict`) with its dataset as the Loader
    reads it (``dataset``: file ids, their chunk sizes, and each sample's extents as
    parallel lists), where the job is now, and how long the registration lives
    unless registered again (``ttl``)."""

    plan: dict[str, Any]
    dataset: dict[str, Any]
    position: PlanPosition
    ttl: float = 600.0

    def to_json(self) -> dict[str, Any]:
        return {"plan": self.plan, "dataset": self.dataset, "epoch": self.position.epoch,
                "cursor": self.position.cursor, "ttl": self.ttl}

    @classmethod
    def from_json(cls, obj: Any) -> PlanRequest:
        ttl = field_of(obj, "ttl", _NUMBER, 600.0)
        if not 0 < ttl <= MAX_PLAN_TTL:
            raise BadRequest(f"field 'ttl' must be above 0 and at most {MAX_PLAN_TTL}")
        return cls(field_of(obj, "plan", dict), field_of(obj, "dataset", dict),
                   PlanPosition.from_json(obj), float(ttl))


@dataclass(frozen=True)
class PlanRegistered:
    """A registration's answer.  ``filled``: the CRC32Cs of the dataset's chunks that are
    filled now, by file id then chunk index, so that the registrant's client reads them
    straight from the data servers as it would a staged file's (no fill round trip for
    a chunk that is cached already); at most :data:`MAX_FILLED_ANSWERED` of them."""

    plan_id: str
    files: int                      # cached files of the dataset (the others are ignored)
    expires: float
    filled: KnownCrcs = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"plan_id": self.plan_id, "files": self.files, "expires": self.expires,
                "filled": filled_json(self.filled)}

    @classmethod
    def from_json(cls, obj: Any) -> PlanRegistered:
        return cls(field_of(obj, "plan_id", str), count_of(obj, "files"),
                   float(field_of(obj, "expires", _NUMBER)), filled_of(obj))


# -- OpenAPI schemas (merged into stager.protocol.openapi.SCHEMAS) ---------------------------
_STR = {"type": "string"}
_COUNT = {"type": "integer", "minimum": 0}
_GLOBS = {"type": "array", "maxItems": MAX_GLOBS, "items": {"type": "string", "minLength": 1}}
_INDEX = {"type": "integer", "minimum": 0, "maximum": (1 << 32) - 1}


_FILLED = {"type": "array", "items": {
    "type": "object", "required": ["file_id", "chunks", "crc"], "properties": {
        "file_id": _STR, "chunks": {"type": "array", "items": _INDEX},
        "crc": {"type": "array", "items": _STR}}}}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


_ATTACHMENT = {"path": _STR, "source": _STR, "refresh": {"type": ["number", "null"]},
               "include": _GLOBS, "exclude": _GLOBS, "listed": {"type": "number"},
               "files": _COUNT, "bytes": _COUNT, "cached_bytes": _COUNT,
               "cached_chunks": _COUNT, "hits": _COUNT, "misses": _COUNT,
               "hit_ratio": {"type": ["number", "null"]}}
SCHEMAS: dict[str, Any] = {
    "AttachRequest": {"type": "object", "required": ["source"], "properties": {
        "source": {**_STR, "pattern": f"^({'|'.join(SOURCE_PROTOCOLS)})://[^/]"},
        "refresh": {"type": ["number", "null"], "minimum": MIN_REFRESH},
        "include": _GLOBS, "exclude": _GLOBS, "options": {"type": "object"}}},
    "Attachment": {"type": "object", "required": ["path", "source"], "properties": _ATTACHMENT},
    "AttachmentList": {"type": "object", "required": ["attachments"], "properties": {
        "attachments": {"type": "array", "items": _ref("Attachment")}}},
    "Refreshed": {"type": "object", "required": ["attachment"], "properties": {
        "attachment": _ref("Attachment"), "added": _COUNT, "changed": _COUNT,
        "removed": _COUNT, "unchanged": _COUNT, "refused": _COUNT,
        "errors": {"type": "array", "items": _STR}}},
    "Detached": {"type": "object", "required": ["path", "files", "chunks"], "properties": {
        "path": _STR, "files": _COUNT, "chunks": _COUNT}},
    "FillRequest": {"type": "object", "required": ["items"], "properties": {
        "warm": {"type": "boolean"},
        "items": {"type": "array", "items": {"type": "object", "required": ["file_id", "chunks"],
                                             "properties": {
            "file_id": _STR, "chunks": {"type": "array", "items": _INDEX},
            "again": {"type": "array", "items": _INDEX}}}}}},
    "PlanRequest": {"type": "object", "required": ["plan", "dataset", "epoch", "cursor"],
                    "properties": {"plan": {"type": "object"}, "dataset": {"type": "object"},
                                   "epoch": _COUNT, "cursor": _COUNT,
                                   "ttl": {"type": "number", "exclusiveMinimum": 0,
                                           "maximum": MAX_PLAN_TTL}}},
    "PlanPosition": {"type": "object", "required": ["epoch", "cursor"],
                     "properties": {"epoch": _COUNT, "cursor": _COUNT,
                                    "rank": {**_COUNT, "maximum": (1 << 20) - 1},
                                    "learn": {"type": "boolean"}, "filled": _FILLED}},
    "PlanRegistered": {"type": "object", "required": ["plan_id", "files", "expires"],
                       "properties": {"plan_id": _STR, "files": _COUNT,
                                      "expires": {"type": "number"},
                                      "filled": _FILLED}},
    "ReadsCounted": {"type": "object", "required": ["chunks"],
                     "properties": {"chunks": _COUNT}},
    "FillResults": {"type": "object", "required": ["results"], "properties": {
        "results": {"type": "array", "items": {"type": "object"}}}},
}
