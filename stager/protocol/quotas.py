"""The bodies of the quota and pin routes (``stager quota``, ``stager pin``).

A quota caps a directory's subtree in bytes and/or files (``None``: no cap on
that one); its use is what the subtree holds now, kept exact by the store
(:mod:`stager.meta.quotas`).  A pin marks a file or a directory's subtree as never
to evict, until it is unpinned or its ``expires`` (a clock time; ``None``: never).
The store returns these same values, so a field is named in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import BadRequest
from .models import INT64_MAX, count_of, field_of

_NUMBER = (int, float)
MAX_PIN_TTL = 10 * 365 * 86400      # ten years: a longer pin is a pin without a ttl


@dataclass(frozen=True)
class QuotaRequest:
    """Set a directory's limits; both ``None``: the quota goes."""

    bytes: int | None = None
    files: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "files": self.files}

    @classmethod
    def from_json(cls, obj: Any) -> QuotaRequest:
        return cls(count_of(obj, "bytes", None), count_of(obj, "files", None))


@dataclass(frozen=True)
class Quota:
    """A directory's limits and what its subtree uses of them."""

    path: str
    bytes: int | None
    files: int | None
    used_bytes: int
    used_files: int

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "bytes": self.bytes, "files": self.files,
                "used_bytes": self.used_bytes, "used_files": self.used_files}

    @classmethod
    def from_json(cls, obj: Any) -> Quota:
        return cls(field_of(obj, "path", str), count_of(obj, "bytes", None),
                   count_of(obj, "files", None), count_of(obj, "used_bytes"),
                   count_of(obj, "used_files"))


@dataclass(frozen=True)
class QuotaList:
    quotas: tuple[Quota, ...]

    def to_json(self) -> dict[str, Any]:
        return {"quotas": [q.to_json() for q in self.quotas]}

    @classmethod
    def from_json(cls, obj: Any) -> QuotaList:
        return cls(tuple(Quota.from_json(q) for q in field_of(obj, "quotas", list)))


@dataclass(frozen=True)
class PinRequest:
    """Pin a path for ``ttl`` seconds (``None``: until unpinned)."""

    ttl: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"ttl": self.ttl}

    @classmethod
    def from_json(cls, obj: Any) -> PinRequest:
        ttl = field_of(obj, "ttl", _NUMBER, None)
        if ttl is not None and not 0 < ttl <= MAX_PIN_TTL:
            raise BadRequest(f"field 'ttl' must be a number of seconds above 0, at most "
                             f"{MAX_PIN_TTL}")
        return cls(ttl)


@dataclass(frozen=True)
class Pin:
    path: str
    expires: float | None
    created: float

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "expires": self.expires, "created": self.created}

    @classmethod
    def from_json(cls, obj: Any) -> Pin:
        return cls(field_of(obj, "path", str), field_of(obj, "expires", _NUMBER, None),
                   field_of(obj, "created", _NUMBER))


@dataclass(frozen=True)
class PinList:
    pins: tuple[Pin, ...]

    def to_json(self) -> dict[str, Any]:
        return {"pins": [p.to_json() for p in self.pins]}

    @classmethod
    def from_json(cls, obj: Any) -> PinList:
        return cls(tuple(Pin.from_json(p) for p in field_of(obj, "pins", list)))



@dataclass(frozen=True)
class Unpinned:
    """The answer to an unpin: the path whose pin went."""

    path: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path}

    @classmethod
    def from_json(cls, obj: Any) -> Unpinned:
        return cls(field_of(obj, "path", str))

# -- OpenAPI schemas (merged into stager.protocol.openapi.SCHEMAS) ---------------------------
_LIMIT = {"type": ["integer", "null"], "minimum": 0, "maximum": INT64_MAX}
_USE = {"type": "integer", "minimum": 0}
_WHEN = {"type": ["number", "null"]}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


SCHEMAS: dict[str, Any] = {
    "QuotaRequest": {"type": "object", "required": [], "properties": {
        "bytes": _LIMIT, "files": _LIMIT}},
    "Quota": {"type": "object", "required": ["path", "bytes", "files", "used_bytes",
                                             "used_files"],
              "properties": {"path": {"type": "string"}, "bytes": _LIMIT, "files": _LIMIT,
                             "used_bytes": _USE, "used_files": _USE}},
    "QuotaList": {"type": "object", "required": ["quotas"], "properties": {
        "quotas": {"type": "array", "items": _ref("Quota")}}},
    "PinRequest": {"type": "object", "required": [], "properties": {
        "ttl": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": MAX_PIN_TTL}}},
    "Pin": {"type": "object", "required": ["path", "expires", "created"],
            "properties": {"path": {"type": "string"}, "expires": _WHEN,
                           "created": {"type": "number"}}},
    "PinList": {"type": "object", "required": ["pins"], "properties": {
        "pins": {"type": "array", "items": _ref("Pin")}}},
    "Unpinned": {"type": "object", "required": ["path"], "properties": {
        "path": {"type": "string"}}},
}
