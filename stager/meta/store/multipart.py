"""The store's multipart role: S3 multipart uploads, their parts, and what collects them.

A multipart upload is a record beside one pending upload (``uploads``) of the final
file: the record names it (``file_id``) and adds what S3 needs, the part size the
first whole-chunk part fixed and each part written.  A part either lies in the
final file's own chunk slots (``file_id`` the final one, from ``first_chunk``), so
that completing is a commit with no copy, or in a hidden file of its own (its own
``file_id``, from chunk 0), composed by a copy at completion.  The pending upload
of a live record is not collected after ``upload_grace`` as other pending uploads
are: the record has its own idle limit (``multipart_idle``), and dropping a record
frees the pending upload and every hidden part in the same transaction.  One of the
roles :class:`~stager.meta.store.base.MetaStore` joins.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ...protocol.models import Layout


@dataclass(frozen=True)
class MultipartRecord:
    """An S3 multipart upload in progress."""

    upload_id: str
    path: str                       # the object's path (/bucket/key)
    file_id: str                    # the final file's pending upload
    layout: Layout                  # its layout; hidden parts use it too
    part_size: int | None           # fixed by the first whole-chunk part (None: none yet)
    created: float
    touched: float                  # the last part written (idle since then)
    extra: str = ""                 # its creator's, kept as given (the S3 gateway: the
                                    # attributes CreateMultipartUpload declared, JSON)


@dataclass(frozen=True)
class PartRecord:
    """One part as written: ``size`` bytes in chunks of ``file_id`` from ``first_chunk``
    on, their CRC32Cs, and the md5 of its bytes (hex: its S3 ETag)."""

    number: int
    file_id: str
    first_chunk: int
    size: int
    md5: str
    checksums: tuple[int, ...]
    written: float
    layout: Layout | None = None    # a hidden part's own (placed around a down target);
                                    # None: the upload's


class Multipart(ABC):
    """Multipart records and parts; every call one transaction."""

    @abstractmethod
    async def begin_multipart(self, record: MultipartRecord) -> None:
        """Keep ``record``, whose pending upload is already begun."""

    @abstractmethod
    async def get_multipart(self, upload_id: str) -> MultipartRecord:
        """The record (NotFound when there is none)."""

    @abstractmethod
    async def fix_part_size(self, upload_id: str, size: int) -> int | None:
        """The upload's part size: ``size`` if none was fixed yet, else the one that
        was (None when the upload is gone)."""

    @abstractmethod
    async def put_part(self, upload_id: str, part: PartRecord) -> bool:
        """Keep ``part``, replacing one of its number (a hidden part replaced goes to
        garbage); touches the record.  False, and ``part`` (if hidden) goes to garbage,
        when the upload is gone."""

    @abstractmethod
    async def list_parts(self, upload_id: str) -> list[PartRecord]:
        """The parts of the upload, by number."""

    @abstractmethod
    async def list_multipart(self, prefix: str, *, after: tuple[str, str],
                             limit: int) -> list[MultipartRecord]:
        """Records whose path starts with ``prefix``, by (path, upload id) after
        ``after``."""

    @abstractmethod
    async def drop_multipart(self, upload_id: str, *, keep: Collection[str], now: float
                             ) -> MultipartRecord:
        """Drop the record and its parts; each hidden part, and the pending upload
        when still pending, goes to garbage, except the file ids in ``keep`` (NotFound
        when there is none)."""

    @abstractmethod
    async def idle_multipart(self, before: float) -> list[MultipartRecord]:
        """Records touched before ``before``."""


def hidden_files(record: MultipartRecord, parts: Sequence[PartRecord],
                 keep: Collection[str]) -> list[tuple[str, Layout]]:
    """The file ids that dropping ``record`` with ``parts`` frees, but for ``keep``, each
    with its layout: the hidden parts (the pending upload is freed by the store, as an
    abort does)."""
    return sorted({(p.file_id, p.layout or record.layout) for p in parts
                   if p.file_id != record.file_id and p.file_id not in keep},
                  key=lambda f: f[0])


async def multipart_files(store: Multipart) -> list[tuple[str, Layout]]:
    """Every file id the live uploads write into, with its layout: each pending final
    file and each hidden part (what fsck must not take for orphans)."""
    out: dict[str, Layout] = {}
    for record in await store.idle_multipart(float("inf")):
        out[record.file_id] = record.layout
        for part in await store.list_parts(record.upload_id):
            out[part.file_id] = part.layout or record.layout
    return sorted(out.items())
