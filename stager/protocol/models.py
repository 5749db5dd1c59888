"""JSON models of the protocol: small frozen value objects with strict parsing.

Each model has ``to_json()`` and ``from_json()``; ``from_json`` rejects wrong
types and missing fields with :class:`~stager.errors.BadRequest`, so handlers
never see half-valid input.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from ..errors import BadRequest, InvalidLayout

T = TypeVar("T")

FILE_ID_RE = re.compile(r"^[0-9a-f]{32}$")
CHUNK_ID_RE = re.compile(r"^([0-9a-f]{32})\.(\d{1,9})$")
TARGET_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

MIN_CHUNK_SIZE = 4096
MAX_REPLICAS = 8
MAX_STRIPE_COUNT = 1024
MAX_LIST_LIMIT = 100_000
INT64_MAX = (1 << 63) - 1   # SQLite's INTEGER: a larger count failed in the store, as a 500

# The bounds the parsers below enforce, as JSON Schema keywords for the OpenAPI document.
COUNT_BOUNDS = {"minimum": 0, "maximum": INT64_MAX}
CHUNK_SIZE_BOUNDS = {"minimum": MIN_CHUNK_SIZE, "maximum": INT64_MAX - INT64_MAX % MIN_CHUNK_SIZE,
                     "multipleOf": MIN_CHUNK_SIZE}
STRIPE_COUNT_BOUNDS = {"minimum": 0, "maximum": MAX_STRIPE_COUNT}
REPLICAS_BOUNDS = {"minimum": 1, "maximum": MAX_REPLICAS}
# A file version's attributes (what the S3 gateway keeps with an object: ETag,
# Content-Type, x-amz-meta-*): a small JSON object, at most this many bytes encoded.
MAX_ATTRS = 8192


def field_of(obj: Mapping[str, Any], key: str, kind: type[T] | tuple[type, ...],
             default: Any = ...) -> Any:
    """``obj[key]`` checked against ``kind``; :class:`BadRequest` when wrong."""
    if not isinstance(obj, Mapping):
        raise BadRequest("expected a JSON object")
    if key not in obj or obj[key] is None:
        if default is ...:
            raise BadRequest(f"missing field {key!r}")
        return default
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int in Python; never accept it where a number is meant.
    if isinstance(value, bool) and bool not in kinds:
        raise BadRequest(f"field {key!r} must be {_names(kinds)}")
    if not isinstance(value, kinds):
        raise BadRequest(f"field {key!r} must be {_names(kinds)}")
    return value


def count_of(obj: Mapping[str, Any], key: str, default: Any = ...) -> Any:
    """``obj[key]``, a whole number from 0 to :data:`INT64_MAX` (sizes, byte counts,
    offsets): every count is stored or computed as a signed 64-bit integer."""
    value = field_of(obj, key, int, default)
    if value is not default and not 0 <= value <= INT64_MAX:
        raise BadRequest(f"field {key!r} must be an integer from 0 to {INT64_MAX}")
    return value


def _names(kinds: tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in kinds)


# A version's attributes known only once its bytes are read (an S3 PUT's ETag is their
# md5): a write asks for them just before its commit.
LateAttrs = Callable[[], dict[str, Any]]


def attrs_text(attrs: Mapping[str, Any] | None) -> str | None:
    """How a file version's attributes are stored and bounded: compact JSON, ``None``
    for none."""
    return json.dumps(attrs, separators=(",", ":"), sort_keys=True) if attrs else None


def attrs_of(obj: Mapping[str, Any], key: str = "attrs") -> dict[str, Any]:
    """``obj[key]``, a file version's attributes: a JSON object of at most
    :data:`MAX_ATTRS` bytes encoded ({} when absent); BadRequest when not."""
    attrs = field_of(obj, key, dict, {})
    try:
        size = len((attrs_text(attrs) or "").encode())
    except (TypeError, ValueError, UnicodeEncodeError):
        raise BadRequest(f"field {key!r} must be a JSON object") from None
    if size > MAX_ATTRS:
        raise BadRequest(f"field {key!r} is {size} bytes encoded, over the limit of "
                         f"{MAX_ATTRS}", size=size, limit=MAX_ATTRS)
    return dict(attrs)


def chunk_id(file_id: str, index: int) -> str:
    return f"{file_id}.{index}"


def parse_chunk_id(text: str) -> tuple[str, int]:
    m = CHUNK_ID_RE.match(text)
    if not m:
        raise BadRequest(f"invalid chunk id {text!r}")
    return m.group(1), int(m.group(2))


def check_file_id(text: Any) -> str:
    if not isinstance(text, str) or not FILE_ID_RE.match(text):
        raise BadRequest(f"invalid file id {text!r}")
    return text


@dataclass(frozen=True)
class LayoutSpec:
    """What a writer or a directory asks for; unset fields are inherited."""

    chunk_size: int | None = None
    stripe_count: int | None = None
    replicas: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, obj: Any) -> LayoutSpec:
        if obj is None:
            return cls()
        if not isinstance(obj, Mapping):
            raise InvalidLayout("layout must be a JSON object")
        unknown = set(obj) - {"chunk_size", "stripe_count", "replicas", "targets", "nodes"}
        if unknown:
            raise InvalidLayout(f"unknown layout fields: {sorted(unknown)}")
        spec = cls(
            chunk_size=count_of(obj, "chunk_size", None),
            stripe_count=field_of(obj, "stripe_count", int, None),
            replicas=field_of(obj, "replicas", int, None),
        )
        spec.validate()
        return spec

    def validate(self, max_chunk_size: int | None = None) -> None:
        if self.chunk_size is not None:
            if self.chunk_size < MIN_CHUNK_SIZE or self.chunk_size % MIN_CHUNK_SIZE:
                raise InvalidLayout(f"chunk_size must be a positive multiple of {MIN_CHUNK_SIZE}")
            if max_chunk_size is not None and self.chunk_size > max_chunk_size:
                raise InvalidLayout(f"chunk_size above the limit of {max_chunk_size}")
        if self.stripe_count is not None and not 0 <= self.stripe_count <= MAX_STRIPE_COUNT:
            raise InvalidLayout(f"stripe_count must be between 0 (all) and {MAX_STRIPE_COUNT}")
        if self.replicas is not None and not 1 <= self.replicas <= MAX_REPLICAS:
            raise InvalidLayout(f"replicas must be between 1 and {MAX_REPLICAS}")

    def merged_over(self, base: LayoutSpec) -> LayoutSpec:
        """This spec with its unset fields taken from ``base``."""
        return LayoutSpec(
            chunk_size=self.chunk_size if self.chunk_size is not None else base.chunk_size,
            stripe_count=self.stripe_count if self.stripe_count is not None else base.stripe_count,
            replicas=self.replicas if self.replicas is not None else base.replicas,
        )


@dataclass(frozen=True)
class Layout:
    """Where a file's chunks live; decided once at create time.

    Chunk *i* lives on ``targets[i % stripe_count]``; its replicas on the next
    targets in cyclic order whose node is not yet used (see
    :func:`stager.layout.chunk_targets`).  ``nodes[k]`` is the node of ``targets[k]``.
    """

    chunk_size: int
    stripe_count: int
    replicas: int
    targets: tuple[str, ...]
    nodes: tuple[str, ...]
    # A file of an attached directory: its chunks are filled from the source on first
    # read (a reader asks the metadata server first: route ``fill``), and may be
    # evicted; a missing chunk is not lost data.
    cached: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "chunk_size": self.chunk_size,
            "stripe_count": self.stripe_count,
            "replicas": self.replicas,
            "targets": list(self.targets),
            "nodes": list(self.nodes),
        }
        if self.cached:
            out["cached"] = True
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Layout:
        targets = field_of(obj, "targets", list)
        nodes = field_of(obj, "nodes", list)
        if not all(isinstance(t, str) for t in targets + nodes) or len(targets) != len(nodes):
            raise InvalidLayout("targets and nodes must be lists of strings of equal length")
        layout = cls(
            chunk_size=count_of(obj, "chunk_size"),
            stripe_count=field_of(obj, "stripe_count", int),
            replicas=field_of(obj, "replicas", int),
            targets=tuple(targets),
            nodes=tuple(nodes),
            cached=field_of(obj, "cached", bool, False),
        )
        if layout.stripe_count != len(layout.targets) or layout.stripe_count < 1:
            raise InvalidLayout("stripe_count must equal the number of targets")
        LayoutSpec(layout.chunk_size, layout.stripe_count, layout.replicas).validate()
        return layout

    def chunk_count(self, size: int) -> int:
        return -(-size // self.chunk_size)


@dataclass(frozen=True)
class FileInfo:
    """What ``stat`` says of a path."""

    path: str
    type: str                      # "file" or "directory"
    size: int = 0
    mtime: float = 0.0
    file_id: str | None = None
    layout: Layout | None = None   # files: the layout; directories: None
    default_layout: LayoutSpec | None = None   # directories: what new files inherit
    checksums: tuple[int, ...] | None = None   # per chunk CRC32C (stat only, not listings)
    locations: dict[str, str] = field(default_factory=dict)  # target id → URL
    capability: str | None = None  # with auth on, a file's stat: a read capability for it
    # files: the attributes committed with this version (S3's ETag, Content-Type, …);
    # a version written by any other way has none
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def is_dir(self) -> bool:
        return self.type == "directory"

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1] or "/"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "type": self.type, "size": self.size,
                               "mtime": self.mtime}
        if self.file_id is not None:
            out["file_id"] = self.file_id
        if self.layout is not None:
            out["layout"] = self.layout.to_json()
        if self.default_layout is not None and self.default_layout.to_json():
            out["default_layout"] = self.default_layout.to_json()
        if self.checksums is not None:
            out["checksums"] = [f"{c:08x}" for c in self.checksums]
        if self.locations:
            out["locations"] = dict(self.locations)
        if self.capability is not None:
            out["capability"] = self.capability
        if self.attrs:
            out["attrs"] = dict(self.attrs)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> FileInfo:
        checksums = field_of(obj, "checksums", list, None)
        layout = field_of(obj, "layout", dict, None)
        default_layout = field_of(obj, "default_layout", dict, None)
        return cls(
            path=field_of(obj, "path", str),
            type=field_of(obj, "type", str),
            size=count_of(obj, "size", 0),
            mtime=float(field_of(obj, "mtime", (int, float), 0.0)),
            file_id=field_of(obj, "file_id", str, None),
            layout=Layout.from_json(layout) if layout is not None else None,
            default_layout=LayoutSpec.from_json(default_layout) if default_layout else None,
            checksums=tuple(int(c, 16) for c in checksums) if checksums is not None else None,
            locations=dict(field_of(obj, "locations", dict, {})),
            capability=field_of(obj, "capability", str, None),
            attrs=attrs_of(obj),
        )


@dataclass(frozen=True, slots=True)
class TargetInfo:
    """A storage target as the metadata server knows it."""

    id: str
    node: str
    url: str
    capacity: int = 0
    used: int = 0
    state: str = "up"              # "up" or "down"
    last_heartbeat: float = 0.0    # unix time
    chunks: int = 0
    # The data server process's incarnation: a random id made when it starts and sent
    # with its registration; a suspicion of the target holds for one incarnation only
    # (stager/meta/suspicion.py).  "" from a data server that sends none.
    boot: str = ""

    @property
    def up(self) -> bool:
        return self.state == "up"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any) -> TargetInfo:
        target_id = field_of(obj, "id", str)
        if not TARGET_ID_RE.match(target_id):
            raise BadRequest(f"invalid target id {target_id!r}")
        url = field_of(obj, "url", str)
        if not url.startswith(("http://", "https://")):
            raise BadRequest(f"target url must be http(s): {url!r}")
        return cls(
            id=target_id,
            node=field_of(obj, "node", str),
            url=url.rstrip("/"),
            capacity=count_of(obj, "capacity", 0),
            used=count_of(obj, "used", 0),
            state=field_of(obj, "state", str, "up"),
            last_heartbeat=float(field_of(obj, "last_heartbeat", (int, float), 0.0)),
            chunks=count_of(obj, "chunks", 0),
            boot=_boot_of(obj),
        )


BOOT_RE = re.compile(r"^[A-Za-z0-9_.@:-]{0,64}$")


def _boot_of(obj: Mapping[str, Any]) -> str:
    boot = field_of(obj, "boot", str, "")
    if not BOOT_RE.match(boot):
        raise BadRequest(f"invalid boot id {boot[:80]!r}: up to 64 letters, digits, _.@:-")
    return str(boot)


@dataclass(frozen=True)
class ReadItem:
    """One piece of a batched read: ``length`` bytes of ``chunk`` from ``offset``."""

    chunk: str
    offset: int
    length: int

    def to_json(self) -> list[Any]:
        return [self.chunk, self.offset, self.length]

    @classmethod
    def from_json(cls, obj: Any) -> ReadItem:
        if not (isinstance(obj, list) and len(obj) == 3):
            raise BadRequest("a read item is [chunk, offset, length]")
        chunk, offset, length = obj
        if not isinstance(chunk, str) or type(offset) is not int or type(length) is not int:
            raise BadRequest("a read item is [chunk: str, offset: int, length: int]")
        parse_chunk_id(chunk)
        if not (0 <= offset <= INT64_MAX and 0 <= length <= INT64_MAX):
            raise BadRequest(f"offset and length must be from 0 to {INT64_MAX}")
        return cls(chunk, offset, length)
