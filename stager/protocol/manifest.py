"""Dataset manifests: the files of a staged dataset, recorded once, read in one request.

Staging records a manifest on the dataset's directory (relative path, size,
mtime, file id of every file).  Reading it back, the metadata server *resolves*
it against the live namespace: each file gains its layout (deduplicated into
``layouts``), its chunk checksums, and ``stale: true`` when the file at that
path is no longer the one that was staged.  A loader can therefore start on a
100,000-file dataset with one request instead of a listing and 100,000 stats.

Every rank of a job decodes that answer at start (issue 19), so decoding is
built for 100,000 files: msgspec parses the JSON straight into typed structures
(types and ranges checked in C), the checks msgspec cannot express run once over
all files joined together, and a file is looked at one by one only to say which
one is wrong.  The checks are the same either way: paths relative and canonical,
file ids 32 lowercase hex digits, layout indexes in range, checksums 8-digit
hex, sizes integers from 0 to INT64_MAX.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from itertools import chain
from typing import Annotated, Any

import msgspec

from ..errors import BadRequest, InvalidPath
from . import paths
from .models import INT64_MAX, FileInfo, Layout, check_file_id

MANIFEST_VERSION = 1


class ManifestFile(msgspec.Struct, frozen=True, gc=False):
    """One file of a manifest.  A Struct rather than a dataclass: a resolved
    manifest builds one per file, and a Struct is built in C and is not tracked
    by the cycle collector (``gc=False``: it holds only strings, numbers, a
    ``Layout`` and a tuple, so it can be part of no cycle)."""

    path: str                  # relative to the dataset directory, "/"-separated
    size: int
    mtime: float = 0.0
    file_id: str = ""
    layout: Layout | None = None          # filled in when resolved
    checksums: tuple[int, ...] | None = None
    stale: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "mtime": self.mtime,
                "file_id": self.file_id}


@dataclass(frozen=True)
class Manifest:
    path: str                                   # the dataset directory
    files: tuple[ManifestFile, ...]
    source: str = ""
    created: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    locations: dict[str, str] = field(default_factory=dict)   # target id → URL (resolved)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def file_info(self, f: ManifestFile) -> FileInfo:
        """A FileInfo good enough to read ``f`` without a stat (when not stale)."""
        # Both parts were checked canonical when the manifest was decoded: joined
        # as they are (a normalize per file was most of a 100,000-file Loader's start).
        return FileInfo(path=self.path.rstrip("/") + "/" + f.path, type="file", size=f.size,
                        mtime=f.mtime, file_id=f.file_id, layout=f.layout,
                        checksums=f.checksums, locations=self.locations)

    def to_json(self) -> dict[str, Any]:
        """The stored form (what a stager of data sends)."""
        return {"version": MANIFEST_VERSION, "source": self.source, "created": self.created,
                "extra": self.extra, "files": [f.to_json() for f in self.files]}

    @classmethod
    def from_json(cls, obj: Any, path: str = "") -> Manifest:
        """Parse the stored form, or the resolved form the server returns, already
        parsed from JSON (a request body)."""
        try:
            body = msgspec.convert(obj, _Body)
        except msgspec.ValidationError as exc:
            raise BadRequest(f"invalid manifest: {exc}") from None
        return _build(body, path)

    @classmethod
    def decode(cls, data: bytes, path: str = "") -> Manifest:
        """Parse the stored or resolved form from JSON text: what a client does with
        the server's answer; the same checks as :meth:`from_json`, without building
        the JSON's dicts and lists first."""
        try:
            body = _DECODER.decode(data)
        except msgspec.DecodeError as exc:      # ValidationError is a DecodeError too
            raise BadRequest(f"invalid manifest: {exc}") from None
        return _build(body, path)


# -- the wire form: what msgspec checks on its own ------------------------------------

_Count = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
_Index = Annotated[int, msgspec.Meta(ge=0)]
_Crc = Annotated[str, msgspec.Meta(min_length=8, max_length=8)]     # hex: _checksums


class _File(msgspec.Struct, gc=False):
    path: str
    size: _Count
    file_id: str
    mtime: float = 0.0
    layout: _Index | None = None          # an index into the body's layouts (resolved)
    checksums: tuple[_Crc, ...] = ()   # not a list: the cycle collector untracks a tuple of str
    stale: bool = False


class _Body(msgspec.Struct):
    files: list[_File]
    version: int = MANIFEST_VERSION
    path: str | None = None
    source: str = ""
    created: float = 0.0
    extra: dict[str, Any] = {}
    layouts: list[dict[str, Any]] = []
    locations: dict[str, str] = {}


_DECODER = msgspec.json.Decoder(_Body)


def _build(body: _Body, path: str) -> Manifest:
    if body.version != MANIFEST_VERSION:
        raise BadRequest(f"unsupported manifest version {body.version}")
    layouts = [Layout.from_json(x) for x in body.layouts]
    wire = body.files
    _check_paths([f.path for f in wire])
    _check_file_ids([f.file_id for f in wire])
    sums = _checksums([f.checksums for f in wire if f.layout is not None])
    files = []
    k = 0           # the first of the next resolved file's checksums in sums
    for f in wire:
        if f.layout is None:
            files.append(ManifestFile(f.path, f.size, f.mtime, f.file_id, stale=f.stale))
            continue
        if f.layout >= len(layouts):
            raise BadRequest(f"manifest file {f.path!r} refers to a missing layout")
        n = len(f.checksums)
        files.append(ManifestFile(f.path, f.size, f.mtime, f.file_id, layouts[f.layout],
                                  sums[k:k + n], f.stale))
        k += n
    where = path if body.path is None else body.path
    return Manifest(path=paths.normalize(where) if where else where, files=tuple(files),
                    source=body.source, created=body.created, extra=body.extra,
                    locations=body.locations)


# -- the checks msgspec cannot express, over all files at once ------------------------

_HEX_DIGITS = b"0123456789abcdef"
_CRC_DIGITS = "0123456789abcdefABCDEF"


def _check_paths(rels: list[str]) -> None:
    """Each of ``rels`` is relative and canonical: :func:`_check_path`."""
    if not _paths_surely_canonical(rels):
        for rel in rels:          # one by one, to name the culprit
            _check_path(rel)


def _check_path(rel: str) -> None:
    if not rel or rel.startswith("/") or rel.endswith("/"):
        raise BadRequest(f"manifest paths are relative and canonical: {rel!r}")
    try:
        paths.normalize("/" + rel)    # empty, "." or ".." segments, NUL, lengths
    except InvalidPath as exc:
        raise InvalidPath(f"manifest path {rel!r}: {exc.message}", path=rel) from None


def _paths_surely_canonical(rels: list[str]) -> bool:
    """True only when every one of ``rels`` passes :func:`_check_path`; False when
    one may not (a non-printable or long name: the exact check decides)."""
    if not rels:
        return True
    joined = "\n".join(rels)
    if joined.count("\n") != len(rels) - 1:       # a path holds a newline
        return False
    # With "/" around and between them, a bad path shows as an empty, "." or ".."
    # segment: "a//b", "/a", "a/", "" and "./a" all put "//" or "/./" in the string.
    slashed = "/" + joined.replace("\n", "/") + "/"
    if "//" in slashed or "/./" in slashed or "/../" in slashed:
        return False
    if not slashed.isprintable():                 # control characters (and some others)
        return False
    longest = max(map(len, rels))
    if slashed.isascii():                         # a character is a byte
        return longest + 1 <= paths.MAX_PATH and (
            longest <= paths.MAX_NAME or max(map(len, slashed.split("/"))) <= paths.MAX_NAME)
    try:
        encoded = slashed.encode("utf-8")
    except UnicodeEncodeError:                    # a lone surrogate
        return False
    if max(map(len, encoded.split(b"/"))) > paths.MAX_NAME:
        return False
    if 4 * longest + 1 > paths.MAX_PATH:          # may be too long once encoded
        return max(len(rel.encode("utf-8")) for rel in rels) + 1 <= paths.MAX_PATH
    return True


def _check_file_ids(ids: list[str]) -> None:
    joined = "".join(ids)
    if (set(map(len, ids)) <= {32} and joined.isascii()
            and not joined.encode("ascii").translate(None, _HEX_DIGITS)):
        return
    for file_id in ids:
        check_file_id(file_id)


def _checksums(groups: list[tuple[str, ...]]) -> tuple[int, ...]:
    """The CRC32Cs of ``groups``, one after the other: each 8 hex digits, as
    :func:`stager.checksum.from_hex` takes them (the decoder checked the lengths)."""
    joined = "".join(chain.from_iterable(groups))
    try:
        return struct.unpack(f">{len(joined) // 8}I", bytes.fromhex(joined))
    except (ValueError, struct.error):            # not hex, or spaces that fromhex skipped
        wrong = next(t for t in chain.from_iterable(groups)
                     if not all(c in _CRC_DIGITS for c in t))
        raise BadRequest(f"checksums must be 8-digit hex strings, not {wrong!r}") from None
