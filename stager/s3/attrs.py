"""What S3 keeps with an object besides its bytes: ETag, Content-Type, ``x-amz-meta-*``.

A stager file carries no attributes, and the metadata store is left as it is: each
object written through S3 gets a small JSON record of its own, a stager file at
``/.s3/attrs/BUCKET/SHA256(KEY)`` (the ``.s3`` top-level directory is no bucket).
The record names the file id of the version it describes, so it is ignored once the
object is written again by another way (``stager put``, fsspec, the mount): such a
file has the default attributes, as has any file never written through S3.

The record is written after the object is committed; a crash between the two leaves
the object with default attributes, never another object's.  The default ETag is
``"FILE_ID-1"``: not an MD5 (clients that compare ETags with MD5s, such as rclone,
skip a value with a ``-`` as they do for multipart uploads).  Records are cached
per gateway, keyed by path and file id, so a HEAD or GET of a known object costs
no extra round trip; so is the absence of a record (a file staged or written by
stager itself), for ``ABSENT_TTL`` seconds only, as another gateway may be writing
the record of a version just committed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any

from ..client import AsyncClient
from ..errors import Forbidden, NotFound, StagerError, Unauthenticated
from ..protocol.models import FileInfo
from .names import HIDDEN

log = logging.getLogger(__name__)

KEPT = 100_000               # records cached per gateway
ABSENT_TTL = 5.0             # seconds "no record for this version" is believed
DEFAULT_TYPE = "binary/octet-stream"


@dataclass(frozen=True)
class ObjectAttrs:
    file_id: str
    etag: str                                  # quoted, as sent in the ETag header
    content_type: str = DEFAULT_TYPE
    metadata: dict[str, str] = field(default_factory=dict)     # x-amz-meta-NAME -> value
    checksums: dict[str, str] = field(default_factory=dict)    # "crc32" -> base64
    parts: int = 0                             # multipart: how many parts (0: a PUT)
    part_sizes: tuple[int, ...] = ()           # multipart: each part's size (partNumber=N)
    extra: dict[str, str] = field(default_factory=dict)        # Content-Encoding and kin

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any) -> ObjectAttrs:
        if not isinstance(obj, dict):
            raise ValueError("an attribute record is a JSON object")
        return cls(file_id=str(obj["file_id"]), etag=str(obj["etag"]),
                   content_type=str(obj.get("content_type") or DEFAULT_TYPE),
                   metadata={str(k): str(v) for k, v in dict(obj.get("metadata", {})).items()},
                   checksums={str(k): str(v)
                              for k, v in dict(obj.get("checksums", {})).items()},
                   parts=int(obj.get("parts", 0)),
                   part_sizes=tuple(int(n) for n in obj.get("part_sizes", ())),
                   extra={str(k): str(v) for k, v in dict(obj.get("extra", {})).items()})


def default_attrs(info: FileInfo) -> ObjectAttrs:
    return ObjectAttrs(file_id=info.file_id or "", etag=f'"{info.file_id or "0"}-1"')


def record_path(bucket: str, key: str) -> str:
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return f"/{HIDDEN}/attrs/{bucket}/{digest}"


class AttrStore:
    """Reads and writes the attribute records, with a cache of those seen."""

    def __init__(self) -> None:
        # path -> (attributes, monotonic time until which they hold; inf: a record read)
        self._seen: OrderedDict[str, tuple[ObjectAttrs, float]] = OrderedDict()

    def _keep(self, path: str, attrs: ObjectAttrs, until: float = float("inf")) -> None:
        self._seen.pop(path, None)
        self._seen[path] = (attrs, until)
        while len(self._seen) > KEPT:
            self._seen.popitem(last=False)

    def _absent(self, path: str, info: FileInfo) -> ObjectAttrs:
        """No record of this version: the defaults, believed for ``ABSENT_TTL``."""
        attrs = default_attrs(info)
        self._keep(path, attrs, time.monotonic() + ABSENT_TTL)
        return attrs

    async def load(self, client: AsyncClient, bucket: str, key: str,
                   info: FileInfo) -> ObjectAttrs:
        """The attributes of the object ``info`` is (the default ones when no record
        of this version exists)."""
        rec = record_path(bucket, key)
        hit = self._seen.get(rec)
        if hit is not None and hit[0].file_id == info.file_id and time.monotonic() < hit[1]:
            return hit[0]
        try:
            raw = await client.cat(rec)
            attrs = ObjectAttrs.from_json(json.loads(raw))
        except (NotFound, ValueError, KeyError, TypeError):
            return self._absent(rec, info)
        except (Forbidden, Unauthenticated):
            # a token for a prefix does not cover /.s3: its objects read with the
            # default attributes rather than not at all
            return self._absent(rec, info)
        if attrs.file_id != info.file_id:
            return self._absent(rec, info)
        self._keep(rec, attrs)
        return attrs

    async def save(self, client: AsyncClient, bucket: str, key: str,
                   attrs: ObjectAttrs) -> bool:
        """Write the record of ``attrs``' object; ``False`` where the client's token
        may not (a token for a prefix does not cover ``/.s3``): the object, already
        committed, then has the default attributes, and its write still succeeds."""
        rec = record_path(bucket, key)
        try:
            await client.pipe(rec, json.dumps(attrs.to_json()).encode())
        except (Forbidden, Unauthenticated):
            log.info("no attribute record for /%s/%s: the token may not write %s",
                     bucket, key, rec)
            return False
        self._keep(rec, attrs)
        return True

    async def drop(self, client: AsyncClient, bucket: str, key: str) -> None:
        rec = record_path(bucket, key)
        self._seen.pop(rec, None)
        try:
            await client.rm(rec)
        except StagerError:
            pass        # none, or already gone: a stale record is ignored anyway

    async def drop_bucket(self, client: AsyncClient, bucket: str) -> None:
        try:
            await client.rm(f"/{HIDDEN}/attrs/{bucket}", recursive=True)
        except StagerError:
            pass
        for rec in [p for p in self._seen if p.startswith(f"/{HIDDEN}/attrs/{bucket}/")]:
            del self._seen[rec]
