"""What S3 keeps with an object besides its bytes: ETag, Content-Type, ``x-amz-meta-*``.

They are the attributes of the file version the object is (``FileInfo.attrs``, under
the key ``"s3"``), stored by the metadata store in the row of that version and set by
its commit: a PUT, a CopyObject or a CompleteMultipartUpload commits its file with
them, atomically, so no object is ever seen without its own.  They come back with the
file's stat and with every directory listing entry, so HEAD, GET and a listing's
ETags cost no round trip of their own, and whatever a token may read of a file it
may read of its attributes.

A version written by any other way (``stager put``, fsspec, the mount) has none, so
an object written again that way has the default attributes, as has any file never
written through S3.  The default ETag is ``"FILE_ID-1"``: unique to the version, not
an MD5 (clients that compare ETags with MD5s, such as rclone, skip a value with a
``-`` as they do for multipart uploads).

A file version's attributes are bounded (:data:`~stager.protocol.models.MAX_ATTRS`
bytes encoded), so a multipart object's part sizes are kept run-length encoded (its
parts are mostly of one size); an object whose sizes still do not fit keeps its part
count only, and a GET of one of its parts is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..client import AsyncClient
from ..errors import StagerError
from ..protocol.models import MAX_ATTRS, FileInfo, attrs_text
from .names import HIDDEN

KEY = "s3"                   # the gateway's key in a file version's attributes
DEFAULT_TYPE = "binary/octet-stream"


@dataclass(frozen=True)
class ObjectAttrs:
    etag: str                                  # quoted, as sent in the ETag header
    content_type: str = DEFAULT_TYPE
    metadata: dict[str, str] = field(default_factory=dict)     # x-amz-meta-NAME -> value
    checksums: dict[str, str] = field(default_factory=dict)    # "crc32" -> base64
    parts: int = 0                             # multipart: how many parts (0: a PUT)
    part_sizes: tuple[int, ...] = ()           # multipart: each part's size (partNumber=N)
    extra: dict[str, str] = field(default_factory=dict)        # Content-Encoding and kin

    def to_json(self) -> dict[str, Any]:
        """The record, without the fields at their defaults (the bound is on bytes)."""
        out: dict[str, Any] = {"etag": self.etag}
        if self.content_type != DEFAULT_TYPE:
            out["content_type"] = self.content_type
        for name in ("metadata", "checksums", "extra", "parts"):
            if getattr(self, name):
                out[name] = getattr(self, name)
        if self.part_sizes:
            out["part_sizes"] = _runs(self.part_sizes)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> ObjectAttrs:
        if not isinstance(obj, dict):
            raise ValueError("an attribute record is a JSON object")
        return cls(etag=str(obj["etag"]),
                   content_type=str(obj.get("content_type") or DEFAULT_TYPE),
                   metadata=_strings(obj.get("metadata")),
                   checksums=_strings(obj.get("checksums")),
                   parts=int(obj.get("parts", 0)),
                   part_sizes=tuple(int(size) for size, count in obj.get("part_sizes", ())
                                    for _ in range(int(count))),
                   extra=_strings(obj.get("extra")))

    def stored(self) -> dict[str, Any]:
        """The file version's attributes that hold these: within the bound, the part
        sizes dropped where they alone would pass it."""
        attrs = {KEY: self.to_json()}
        if self.part_sizes and len(attrs_text(attrs) or "") > MAX_ATTRS:
            attrs[KEY].pop("part_sizes")
        return attrs


def _runs(sizes: tuple[int, ...]) -> list[list[int]]:
    runs: list[list[int]] = []
    for size in sizes:
        if runs and runs[-1][0] == size:
            runs[-1][1] += 1
        else:
            runs.append([size, 1])
    return runs


def _strings(obj: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in dict(obj or {}).items()}


def default_attrs(info: FileInfo) -> ObjectAttrs:
    return ObjectAttrs(etag=f'"{info.file_id or "0"}-1"')


def attrs_of(info: FileInfo) -> ObjectAttrs:
    """The attributes of the object ``info`` is: those its version was committed with,
    else the defaults."""
    record = info.attrs.get(KEY)
    if record is not None:
        try:
            return ObjectAttrs.from_json(record)
        except (ValueError, KeyError, TypeError):
            pass        # not the gateway's record: the version is as any other file
    return default_attrs(info)


def fits(attrs: ObjectAttrs) -> bool:
    """Whether ``attrs`` are within a file version's bound."""
    return len((attrs_text(attrs.stored()) or "").encode()) <= MAX_ATTRS


async def drop_old_records(client: AsyncClient, bucket: str) -> None:
    """Remove a deleted bucket's attribute records left by earlier gateways, hidden
    stager files at ``/.s3/attrs/BUCKET/SHA256(KEY)``: they are never read now (an
    object written by such a gateway has the default attributes until it is written
    again)."""
    try:
        await client.rm(f"/{HIDDEN}/attrs/{bucket}", recursive=True)
    except StagerError:
        pass        # none (or a token that may not): they are ignored anyway
