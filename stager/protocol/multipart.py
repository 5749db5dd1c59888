"""The bodies of the multipart routes: S3 multipart uploads on the metadata server.

A multipart upload (``/v1/multipart``) is a pending file that parts are written into
and that completes at once.  Before writing part N, a writer asks where it goes
(:class:`PartBegin` → :class:`PartSlot`): into the final file's own chunk slots from
``first_chunk`` when its size allows (the upload's part size is fixed by the first
part of a whole number of chunks; a part no longer than it is written in place), else
into a hidden file of its own.  The writer then records what it wrote (:class:`PartDone`).
Completing (:class:`CompleteRequest`) either commits the final file as it lies (no
copy), or answers the few parts to write again in their slots first (``move``: a part
that began before the part size was fixed, such as a short last part sent first),
or the parts to compose (``compose``), which the writer copies into a new file before
dropping the upload.  The store returns these same values, so a field
is named in one place (:mod:`stager.meta.store.multipart`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import BadRequest
from .models import (
    FileInfo,
    Layout,
    LayoutSpec,
    attrs_of,
    check_file_id,
    count_of,
    field_of,
)

MAX_PART_NUMBER = 10000         # S3's
MAX_PARTS_LISTED = 1000
MAX_EXTRA = 16 << 10            # bytes of an upload's ``extra``


def part_number(value: Any) -> int:
    """A part number: an integer from 1 to :data:`MAX_PART_NUMBER`."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if isinstance(value, bool) or not 1 <= number <= MAX_PART_NUMBER:
        raise BadRequest(f"a part number is an integer from 1 to {MAX_PART_NUMBER}",
                         reason="invalid_part_number")
    return number


def _crcs(obj: Any, key: str) -> tuple[int, ...]:
    values = field_of(obj, key, list)
    try:
        return tuple(int(v, 16) for v in values)
    except (TypeError, ValueError):
        raise BadRequest(f"field {key!r} must be a list of hex CRC32Cs") from None


@dataclass(frozen=True)
class MultipartCreate:
    """Begin an upload of ``path``; ``extra``: the creator's text, kept with the upload
    (at most :data:`MAX_EXTRA` bytes; the S3 gateway's declared attributes)."""

    path: str
    layout: LayoutSpec | None = None
    extra: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "extra": self.extra}
        if self.layout is not None:
            out["layout"] = self.layout.to_json()
        return out

    @classmethod
    def from_json(cls, obj: Any) -> MultipartCreate:
        layout = field_of(obj, "layout", dict, None)
        extra = field_of(obj, "extra", str, "")
        if len(extra.encode("utf-8", "surrogatepass")) > MAX_EXTRA:
            raise BadRequest(f"extra is over {MAX_EXTRA} bytes")
        return cls(field_of(obj, "path", str),
                   None if layout is None else LayoutSpec.from_json(layout), extra)


@dataclass(frozen=True)
class MultipartUpload:
    """An upload in progress, as listed."""

    upload_id: str
    path: str
    file_id: str
    layout: Layout
    part_size: int | None
    created: float
    touched: float
    extra: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"upload_id": self.upload_id, "path": self.path, "file_id": self.file_id,
                "layout": self.layout.to_json(), "part_size": self.part_size,
                "created": self.created, "touched": self.touched, "extra": self.extra}

    @classmethod
    def from_json(cls, obj: Any) -> MultipartUpload:
        return cls(field_of(obj, "upload_id", str), field_of(obj, "path", str),
                   field_of(obj, "file_id", str), Layout.from_json(field_of(obj, "layout", dict)),
                   count_of(obj, "part_size", None), field_of(obj, "created", (int, float)),
                   field_of(obj, "touched", (int, float)), field_of(obj, "extra", str, ""))


@dataclass(frozen=True)
class PartBegin:
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size}

    @classmethod
    def from_json(cls, obj: Any) -> PartBegin:
        return cls(count_of(obj, "size"))


@dataclass(frozen=True)
class PartSlot:
    """Where part bytes lie (or go): chunks of ``file_id`` from ``first_chunk`` on.
    ``part_size``: the upload's fixed part size, given with a slot in the upload's own
    file, so that a writer places its next parts of at most that size itself, from
    chunk ``(N-1)·part_size/chunk_size``, without asking (the part's record checks it)."""

    file_id: str
    first_chunk: int
    layout: Layout
    locations: dict[str, str]
    capability: str | None = None     # with auth on: for ``file_id``
    part_size: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file_id": self.file_id, "first_chunk": self.first_chunk,
                               "layout": self.layout.to_json(),
                               "locations": dict(self.locations)}
        if self.capability is not None:
            out["capability"] = self.capability
        if self.part_size is not None:
            out["part_size"] = self.part_size
        return out

    @classmethod
    def from_json(cls, obj: Any) -> PartSlot:
        return cls(field_of(obj, "file_id", str), count_of(obj, "first_chunk"),
                   Layout.from_json(field_of(obj, "layout", dict)),
                   dict(field_of(obj, "locations", dict)),
                   field_of(obj, "capability", str, None), count_of(obj, "part_size", None))


@dataclass(frozen=True)
class PartDone:
    """A part written: where (the slot's layout too), its size, the md5 of its bytes
    (hex) and its chunks' CRCs."""

    file_id: str
    first_chunk: int
    size: int
    md5: str
    checksums: tuple[int, ...]
    layout: Layout | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"file_id": self.file_id, "first_chunk": self.first_chunk, "size": self.size,
               "md5": self.md5, "checksums": [f"{c:08x}" for c in self.checksums]}
        if self.layout is not None:
            out["layout"] = self.layout.to_json()
        return out

    @classmethod
    def from_json(cls, obj: Any) -> PartDone:
        md5 = field_of(obj, "md5", str)
        if len(md5) != 32 or any(c not in "0123456789abcdef" for c in md5):
            raise BadRequest("md5 must be 32 lowercase hex digits")
        layout = field_of(obj, "layout", dict, None)
        return cls(field_of(obj, "file_id", str), count_of(obj, "first_chunk"),
                   count_of(obj, "size"), md5, _crcs(obj, "checksums"),
                   None if layout is None else Layout.from_json(layout))


@dataclass(frozen=True)
class Part:
    number: int
    size: int
    md5: str
    written: float
    slot: PartSlot | None = None        # where it lies: in a completion's ``compose``
    checksums: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"number": self.number, "size": self.size, "md5": self.md5,
                               "written": self.written}
        if self.slot is not None:
            out["slot"] = self.slot.to_json()
            out["checksums"] = [f"{c:08x}" for c in self.checksums]
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Part:
        slot = field_of(obj, "slot", dict, None)
        return cls(part_number(field_of(obj, "number", int)), count_of(obj, "size"),
                   field_of(obj, "md5", str), field_of(obj, "written", (int, float)),
                   None if slot is None else PartSlot.from_json(slot),
                   _crcs(obj, "checksums") if slot is not None else ())


@dataclass(frozen=True)
class PartList:
    upload: MultipartUpload
    parts: tuple[Part, ...]

    def to_json(self) -> dict[str, Any]:
        return {"upload": self.upload.to_json(), "parts": [p.to_json() for p in self.parts]}

    @classmethod
    def from_json(cls, obj: Any) -> PartList:
        return cls(MultipartUpload.from_json(field_of(obj, "upload", dict)),
                   tuple(Part.from_json(p) for p in field_of(obj, "parts", list)))


@dataclass(frozen=True)
class MultipartList:
    uploads: tuple[MultipartUpload, ...]
    truncated: bool = False         # a page's worth: more may follow the last

    def to_json(self) -> dict[str, Any]:
        return {"uploads": [u.to_json() for u in self.uploads], "truncated": self.truncated}

    @classmethod
    def from_json(cls, obj: Any) -> MultipartList:
        return cls(tuple(MultipartUpload.from_json(u) for u in field_of(obj, "uploads", list)),
                   field_of(obj, "truncated", bool, False))


@dataclass(frozen=True)
class CompleteRequest:
    """The parts of the object, in order: (number, md5 hex: the part's ETag); and the
    attributes its file is committed with (as a commit item's)."""

    parts: tuple[tuple[int, str], ...]
    attrs: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"parts": [[n, md5] for n, md5 in self.parts]}
        if self.attrs:
            out["attrs"] = dict(self.attrs)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> CompleteRequest:
        items = field_of(obj, "parts", list)
        if not items or len(items) > MAX_PART_NUMBER:
            raise BadRequest(f"a completion names 1 to {MAX_PART_NUMBER} parts",
                             reason="malformed")
        parts = []
        for item in items:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], str)):
                raise BadRequest("each part is [number, etag]", reason="malformed")
            parts.append((part_number(item[0]), item[1]))
        return cls(tuple(parts), attrs_of(obj))


@dataclass(frozen=True)
class CompleteResult:
    """A completion: the object committed (``file``), or the parts to compose into a
    new file (``compose``, in order), and the object's S3 ETag either way."""

    etag: str
    part_sizes: tuple[int, ...]
    file: FileInfo | None = None
    compose: tuple[Part, ...] = ()
    move: tuple[Part, ...] = ()       # parts to write again in place, then complete again

    def to_json(self) -> dict[str, Any]:
        return {"etag": self.etag, "part_sizes": list(self.part_sizes),
                "file": None if self.file is None else self.file.to_json(),
                "compose": [p.to_json() for p in self.compose],
                "move": [p.to_json() for p in self.move]}

    @classmethod
    def from_json(cls, obj: Any) -> CompleteResult:
        file = field_of(obj, "file", dict, None)
        sizes = field_of(obj, "part_sizes", list)
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes):
            raise BadRequest("part_sizes must be sizes")
        return cls(field_of(obj, "etag", str), tuple(sizes),
                   None if file is None else FileInfo.from_json(file),
                   tuple(Part.from_json(p) for p in field_of(obj, "compose", list, [])),
                   tuple(Part.from_json(p) for p in field_of(obj, "move", list, [])))


@dataclass(frozen=True)
class SealRequest:
    """Seal the chunks of a completed object at a data server (the metadata server's
    request, before it commits): from then on a write of a chunk of ``file_id`` is refused
    there unless it is that chunk's own bytes (``crcs``: index → CRC32C, the chunks that
    target holds) and lies within the object's ``count`` chunks.  ``release``: lift the
    seal of a completion that did not commit (``count`` and ``crcs`` unused)."""

    file_id: str
    count: int
    crcs: tuple[tuple[int, int], ...]
    release: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"file_id": self.file_id, "count": self.count,
                "crcs": [[i, f"{c:08x}"] for i, c in self.crcs], "release": self.release}

    @classmethod
    def from_json(cls, obj: Any) -> SealRequest:
        items = field_of(obj, "crcs", list)
        crcs = []
        for item in items:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int)
                    and not isinstance(item[0], bool) and item[0] >= 0
                    and isinstance(item[1], str)):
                raise BadRequest("each of crcs is [chunk index, hex CRC32C]")
            crcs.append((item[0], _crcs({"c": [item[1]]}, "c")[0]))
        return cls(check_file_id(field_of(obj, "file_id", str)), count_of(obj, "count"),
                   tuple(crcs), field_of(obj, "release", bool, False))


@dataclass(frozen=True)
class SealResult:
    """The sealed chunks the target does not hold with their CRC (missing, or other
    bytes: a write the completion did not record landed before the seal)."""

    differ: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"differ": list(self.differ)}

    @classmethod
    def from_json(cls, obj: Any) -> SealResult:
        differ = field_of(obj, "differ", list)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in differ):
            raise BadRequest("differ must be chunk indices")
        return cls(tuple(differ))


# -- OpenAPI schemas (merged into stager.protocol.openapi.SCHEMAS) ---------------------------
def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


_OBJ, _STR, _NUM = {"type": "object"}, {"type": "string"}, {"type": "number"}
_COUNT = {"type": "integer", "minimum": 0}
_CRCS = {"type": "array", "items": {"type": "string", "pattern": "^[0-9a-f]{1,8}$"}}
_NUMBER = {"type": "integer", "minimum": 1, "maximum": MAX_PART_NUMBER}
SCHEMAS: dict[str, Any] = {
    "MultipartCreate": {"type": "object", "required": ["path"], "properties": {
        "path": _STR, "layout": _OBJ, "extra": {"type": "string"}}},
    "MultipartUpload": {"type": "object", "required": [
        "upload_id", "path", "file_id", "layout", "part_size", "created", "touched"],
        "properties": {"upload_id": _STR, "path": _STR, "file_id": _STR, "layout": _OBJ,
                       "part_size": {"type": ["integer", "null"], "minimum": 0},
                       "created": _NUM, "touched": _NUM, "extra": _STR}},
    "PartBegin": {"type": "object", "required": ["size"], "properties": {"size": _COUNT}},
    "PartSlot": {"type": "object", "required": ["file_id", "first_chunk", "layout",
                                                "locations"],
                 "properties": {"file_id": _STR, "first_chunk": _COUNT, "layout": _OBJ,
                                "locations": _OBJ, "capability": _STR,
                                "part_size": _COUNT}},
    "PartDone": {"type": "object", "required": ["file_id", "first_chunk", "size", "md5",
                                                "checksums"],
                 "properties": {"file_id": _STR, "first_chunk": _COUNT, "size": _COUNT,
                                "md5": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
                                "checksums": _CRCS, "layout": _OBJ}},
    "Part": {"type": "object", "required": ["number", "size", "md5", "written"],
             "properties": {"number": _NUMBER, "size": _COUNT, "md5": _STR, "written": _NUM,
                            "slot": _ref("PartSlot"), "checksums": _CRCS}},
    "PartList": {"type": "object", "required": ["upload", "parts"], "properties": {
        "upload": _ref("MultipartUpload"), "parts": {"type": "array", "items": _ref("Part")}}},
    "MultipartList": {"type": "object", "required": ["uploads"], "properties": {
        "uploads": {"type": "array", "items": _ref("MultipartUpload")},
        "truncated": {"type": "boolean"}}},
    "CompleteRequest": {"type": "object", "required": ["parts"], "properties": {
        "parts": {"type": "array", "minItems": 1, "maxItems": MAX_PART_NUMBER, "items": {
            "type": "array", "minItems": 2, "maxItems": 2}}, "attrs": _ref("Attrs")}},
    "SealRequest": {"type": "object", "required": ["file_id", "count", "crcs"], "properties": {
        "file_id": _STR, "count": _COUNT, "release": {"type": "boolean"},
        "crcs": {"type": "array", "items": {"type": "array", "minItems": 2, "maxItems": 2}}}},
    "SealResult": {"type": "object", "required": ["differ"], "properties": {
        "differ": {"type": "array", "items": _COUNT}}},
    "CompleteResult": {"type": "object", "required": ["etag", "part_sizes", "file", "compose"],
                       "properties": {"etag": _STR, "file": {"type": ["object", "null"]},
                                      "part_sizes": {"type": "array", "items": _COUNT},
                                      "compose": {"type": "array", "items": _ref("Part")},
                                      "move": {"type": "array", "items": _ref("Part")}}},
}
