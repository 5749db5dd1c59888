"""Batched writes on the wire: creates, commits, aborts or chunks, many in one request.

Small files cost little to move but each needs a create and a commit on the
metadata server and a chunk write on a data server; one request (and one
transaction, one fsync) per batch instead of per file is what makes them fast.
There is no other form: ``create``, ``commit`` and ``abort`` each take a batch, and a
single write is a batch of one (:func:`one` takes its result).

Semantics, the same for every batch route:

* A batch is checked whole before anything is done.  A malformed request (not a
  list, an item of the wrong shape, an invalid path, the same path or file id
  twice, more than :data:`MAX_BATCH_ITEMS` items) fails the whole request — 400,
  or 413 for size — with the index of the first bad item in ``details.index``,
  and changes nothing.
* Well-formed items that fail against the namespace (the path exists and may not
  be replaced, a parent is a file, the upload is unknown, the checksum count is
  wrong) fail alone: their place in the answer's ``results`` holds the error,
  ``{"error": CODE, "message": ..., "status": HTTP status, "details": {...}}``;
  the other items go ahead in the same transaction.
* The answer comes once everything it reports is durable.

A chunk batch (``POST /v1/write`` on a data server) is one body: a JSON line
``{"items": [[chunk, size, crc32c hex], ...]}`` ending in ``\\n``, then the
chunks' bytes, concatenated in that order.  It is stored all or nothing as far
as checking goes (any checksum that does not match fails the whole request
before a byte is written); every chunk is durable before the 2xx.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..checksum import from_hex, to_hex
from ..errors import BadRequest, PayloadTooLarge, StagerError, error_from_wire
from . import paths
from .models import LayoutSpec, attrs_of, check_file_id, count_of, field_of, parse_chunk_id

T = TypeVar("T")

MAX_BATCH_ITEMS = 4096            # items per batch request, every batch route
MAX_CHUNK_BATCH_HEAD = 1 << 20    # bytes of the JSON line of a chunk batch


@dataclass(frozen=True)
class CreateItem:
    """One file to begin writing (an item of ``POST /v1/create``)."""

    path: str
    layout: LayoutSpec | None = None
    overwrite: bool = True
    parents: bool = True

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "overwrite": self.overwrite,
                               "parents": self.parents}
        if self.layout is not None and self.layout.to_json():
            out["layout"] = self.layout.to_json()
        return out

    @classmethod
    def from_json(cls, obj: Any) -> CreateItem:
        layout = field_of(obj, "layout", dict, None)
        return cls(path=paths.normalize(field_of(obj, "path", str)),
                   layout=LayoutSpec.from_json(layout) if layout is not None else None,
                   overwrite=field_of(obj, "overwrite", bool, True),
                   parents=field_of(obj, "parents", bool, True))


@dataclass(frozen=True)
class CommitItem:
    """One upload to finish (an item of ``POST /v1/commit``)."""

    file_id: str
    size: int
    checksums: tuple[int, ...]
    mtime: float | None = None
    attrs: dict[str, Any] = field(default_factory=dict)   # the version's (models.attrs_of)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file_id": self.file_id, "size": self.size,
                               "checksums": [to_hex(c) for c in self.checksums]}
        if self.mtime is not None:
            out["mtime"] = self.mtime
        if self.attrs:
            out["attrs"] = dict(self.attrs)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> CommitItem:
        raw = field_of(obj, "checksums", list)
        try:
            checksums = tuple(from_hex(c) for c in raw)
        except (TypeError, ValueError):
            raise BadRequest("checksums must be 8-digit hex strings") from None
        mtime = field_of(obj, "mtime", (int, float), None)
        return cls(file_id=check_file_id(field_of(obj, "file_id", str)),
                   size=count_of(obj, "size"), checksums=checksums,
                   mtime=float(mtime) if mtime is not None else None, attrs=attrs_of(obj))


def parse_items(body: dict[str, Any], parse: Callable[[Any], T],
                key: Callable[[T], str] | None = None, *, name: str = "items") -> list[T]:
    """The list ``body[name]`` of a batch, each item parsed by ``parse``; the whole
    batch fails on the first bad item (its index in ``details``), or on a ``key``
    seen twice."""
    raw = field_of(body, name, list)
    check_count(len(raw))
    out: list[T] = []
    seen: dict[str, int] = {}
    for index, obj in enumerate(raw):
        try:
            item = parse(obj)
        except StagerError as exc:
            raise type(exc)(f"item {index}: {exc.message}",
                            **{**exc.details, "index": index}) from None
        if key is not None:
            k = key(item)
            if k in seen:
                raise BadRequest(f"item {index}: {k} is also item {seen[k]} of this batch",
                                 index=index, other=seen[k])
            seen[k] = index
        out.append(item)
    return out


def batch_body(values: Sequence[Any], *, name: str = "items") -> dict[str, Any]:
    """A batch request as the client sends it: the items' JSON under ``name`` (what
    :func:`parse_items` reads back)."""
    return {name: list(values)}


def check_count(count: int) -> None:
    if count > MAX_BATCH_ITEMS:
        raise PayloadTooLarge(f"{count} items in one batch; at most {MAX_BATCH_ITEMS}",
                              limit=MAX_BATCH_ITEMS)


# -- results ---------------------------------------------------------------------------
def error_json(exc: StagerError) -> dict[str, Any]:
    """One failed item in a batch answer."""
    return {**exc.to_json(), "status": exc.status}


def is_error(obj: Any) -> bool:
    return isinstance(obj, dict) and "error" in obj


def result_of(obj: Any, parse: Callable[[Any], T]) -> T | StagerError:
    """One item of a batch answer: the value, or the error it reports."""
    if is_error(obj):
        status = obj.get("status")
        return error_from_wire(status if isinstance(status, int) else 400, obj)
    return parse(obj)


def results_json(results: Sequence[T | StagerError | None],
                 to_json: Callable[[T], Any]) -> dict[str, Any]:
    """A batch answer: each item's value (``to_json``), its error, or null, in order."""
    return {"results": [error_json(r) if isinstance(r, StagerError)
                        else None if r is None else to_json(r) for r in results]}


def read_results(answer: Any, parse: Callable[[Any], T]) -> list[T | StagerError]:
    """The items of a batch answer (see :func:`results_json`), each parsed or an error."""
    return [result_of(obj, parse) for obj in field_of(answer, "results", list)]


def one(results: Sequence[T | StagerError]) -> T:
    """The result of a batch of one: its value, or its error raised."""
    if len(results) != 1:
        raise BadRequest(f"a batch of one answered {len(results)} results")
    [result] = results
    if isinstance(result, StagerError):
        raise result
    return result


# -- chunk batches (data servers) -------------------------------------------------------
@dataclass(frozen=True)
class ChunkItem:
    """One chunk of a chunk batch: its id, byte count and CRC32C."""

    chunk: str
    size: int
    crc: int

    def to_json(self) -> list[Any]:
        return [self.chunk, self.size, to_hex(self.crc)]

    @classmethod
    def from_json(cls, obj: Any) -> ChunkItem:
        if not (isinstance(obj, list) and len(obj) == 3):
            raise BadRequest("a chunk item is [chunk, size, crc32c]")
        chunk, size, crc = obj
        if not isinstance(chunk, str) or type(size) is not int or not isinstance(crc, str):
            raise BadRequest("a chunk item is [chunk: str, size: int, crc32c: hex str]")
        parse_chunk_id(chunk)
        if size < 0:
            raise BadRequest("a chunk's size must not be negative")
        try:
            return cls(chunk, size, from_hex(crc))
        except ValueError:
            raise BadRequest(f"{crc!r} is not an 8-digit hex CRC32C") from None


def chunk_batch_head(items: Sequence[ChunkItem]) -> bytes:
    """The JSON line that starts a chunk batch body."""
    return json.dumps({"items": [i.to_json() for i in items]},
                      separators=(",", ":")).encode() + b"\n"


def split_chunk_batch(body: bytes | bytearray) -> list[tuple[ChunkItem, memoryview]]:
    """The chunks of a chunk batch body, each with a view of its bytes."""
    view = memoryview(body)
    end = body.find(b"\n", 0, MAX_CHUNK_BATCH_HEAD + 1)
    if end < 0:
        raise BadRequest("a chunk batch starts with one JSON line ending in a newline")
    try:
        head = json.loads(bytes(view[:end]))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:     # deep: [[[[...
        raise BadRequest(f"malformed JSON line of a chunk batch: {exc}") from None
    if not isinstance(head, dict):
        raise BadRequest("the JSON line of a chunk batch must be an object")
    items = parse_items(head, ChunkItem.from_json, key=lambda i: i.chunk)
    data = view[end + 1:]
    declared = sum(i.size for i in items)
    if declared != len(data):
        raise BadRequest(f"the chunk batch declares {declared} bytes and carries {len(data)}",
                         declared=declared, received=len(data))
    out = []
    pos = 0
    for item in items:
        out.append((item, data[pos:pos + item.size]))
        pos += item.size
    return out
