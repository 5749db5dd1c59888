"""A request body as the gateway writes it: decoded, counted and checked as it streams.

Every check a PUT (or an UploadPart) may ask for is made here, once: the length
(``Content-Length`` or ``x-amz-decoded-content-length``), ``Content-MD5``, a hex
``x-amz-content-sha256``, and the ``x-amz-checksum-crc32/crc32c/sha1/sha256``
values, sent as headers or in an ``aws-chunked`` trailer (``x-amz-trailer``).  A
fault raises :class:`S3Error` from :meth:`Payload.stream` before it ends, so the
write it feeds is aborted and nothing becomes visible.  The MD5 is always made:
it is the object's ETag.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from aiohttp import StreamReader

from ..checksum import crc32c
from .chunked import Trailer, decode
from .errors import S3Error

if TYPE_CHECKING:
    from .context import S3Context

try:        # CRC-64/NVME (the AWS C++ SDK's and object_store's default) is awscrt's alone
    from awscrt.checksums import crc64nvme
except ImportError:     # pragma: no cover - a dependency; refused with a clear error then
    crc64nvme = None

ALGORITHMS = ("crc32", "crc32c", "sha1", "sha256") + (("crc64nvme",) if crc64nvme else ())
THREAD_AT = 256 * 1024      # hash larger pieces in a thread (hashlib lets go of the GIL)
# Pieces of a whole default chunk (4 MiB): the write engine sends a piece that is whole
# chunks as it is, where it copies a smaller one into a chunk buffer, and each piece
# hashed costs one hand-off to a thread (boto3's aws-chunked chunks are 1 MiB).
WHOLE = 4 << 20


class _Crc:
    """A CRC with hashlib's shape."""

    def __init__(self, fn: Callable[[Any, int], int], width: int = 4) -> None:
        self.fn = fn
        self.width = width
        self.value = 0

    def update(self, data: Any) -> None:
        self.value = self.fn(data, self.value)

    def digest(self) -> bytes:
        return self.value.to_bytes(self.width, "big")


def _hasher(name: str) -> Any:
    if name == "crc32":
        return _Crc(zlib.crc32)
    if name == "crc32c":
        return _Crc(crc32c)
    if name == "crc64nvme":
        return _Crc(crc64nvme, 8)
    return hashlib.new(name)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


class Payload:
    """The body of ``ctx``'s request; :meth:`stream` it once."""

    def __init__(self, ctx: S3Context) -> None:
        h = ctx.headers
        self.request = ctx.request
        self.signatures = ctx.principal.chunks
        content_sha = h.get("x-amz-content-sha256", "")
        encoding = h.get("Content-Encoding", "")
        self.chunked = content_sha.startswith("STREAMING-") or "aws-chunked" in encoding
        self.length = self._length(h.get("x-amz-decoded-content-length") if self.chunked
                                   else h.get("Content-Length"))
        if self.chunked and self.length is None:
            raise S3Error("MissingContentLength",
                          "an aws-chunked body needs x-amz-decoded-content-length")
        self.limit = ctx.gateway.config.max_upload_size
        if self.length is not None and self.length > self.limit:
            raise S3Error("EntityTooLarge", f"the body is over the limit of {self.limit} "
                          "bytes (max_upload_size)")
        self.want_md5 = self._md5_header(h.get("Content-MD5"))
        self.want_sha256 = self._sha_header(content_sha)
        self.declared = {a: h[f"x-amz-checksum-{a}"] for a in ALGORITHMS
                         if f"x-amz-checksum-{a}" in h}
        trailing = {t.strip().lower() for t in h.get("x-amz-trailer", "").split(",")
                    if t.strip()}
        for name in trailing | {k.lower() for k in h if k.lower().startswith(
                "x-amz-checksum-") and k.lower() != "x-amz-checksum-algorithm"}:
            alg = name.removeprefix("x-amz-checksum-")
            if alg == "type":
                continue
            if not name.startswith("x-amz-checksum-") or alg not in ALGORITHMS:
                raise S3Error("InvalidRequest", f"the checksum {name!r} is not supported "
                              f"(supported: {', '.join(ALGORITHMS)})")
        if trailing and not self.chunked:
            raise S3Error("InvalidRequest", "x-amz-trailer without an aws-chunked body")
        self.trailing = sorted(n.removeprefix("x-amz-checksum-") for n in trailing)
        self.md5 = ""                       # hex, once streamed
        self.size = 0
        self.checksums: dict[str, str] = {}   # algorithm -> base64, once streamed

    @staticmethod
    def _length(text: str | None) -> int | None:
        if text is None:
            return None
        if not text.isdigit():
            raise S3Error("InvalidArgument", f"a bad content length {text[:40]!r}")
        return int(text)

    @staticmethod
    def _md5_header(text: str | None) -> bytes | None:
        if text is None:
            return None
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != 16:
            raise S3Error("InvalidDigest", "the Content-MD5 is not a base64 MD5")
        return raw

    @staticmethod
    def _sha_header(text: str) -> str | None:
        if len(text) == 64 and all(c in "0123456789abcdef" for c in text.lower()):
            return text.lower()
        return None

    async def stream(self) -> AsyncIterator[bytes]:
        hashers = {"md5": hashlib.md5()}
        for alg in {*self.declared, *self.trailing}:
            hashers[alg] = _hasher(alg)
        if self.want_sha256 is not None and "sha256" not in hashers:
            hashers["sha256"] = _hasher("sha256")
        lanes = _lanes(hashers)
        trailer = Trailer()
        content = self.request.content
        source = _whole(decode(content, trailer, self.signatures) if self.chunked
                        else _body(content, self.length))
        size = 0

        async def counted() -> AsyncIterator[bytes]:
            nonlocal size
            async for piece in source:
                size += len(piece)
                if self.length is not None and size > self.length:
                    raise S3Error("InvalidRequest",
                                  "the body is longer than its declared length")
                if size > self.limit:
                    raise S3Error("EntityTooLarge", f"the body is over the limit of "
                                  f"{self.limit} bytes (max_upload_size)")
                yield piece

        async with aclosing(hashed(counted(), lanes)) as pieces:
            async for piece in pieces:
                yield piece
        if self.length is not None and size != self.length:
            raise S3Error("IncompleteBody", f"the body has {size} bytes, not {self.length}")
        self.size = size
        self._verify(hashers, trailer)

    def _verify(self, hashers: dict[str, Any], trailer: Trailer) -> None:
        md5 = hashers["md5"].digest()
        if self.want_md5 is not None and md5 != self.want_md5:
            raise S3Error("BadDigest", "the Content-MD5 does not match the body")
        if self.want_sha256 is not None and \
                hashers["sha256"].hexdigest() != self.want_sha256:
            raise S3Error("XAmzContentSHA256Mismatch",
                          "the x-amz-content-sha256 does not match the body")
        wanted = dict(self.declared)
        for alg in self.trailing:
            value = trailer.headers.get(f"x-amz-checksum-{alg}")
            if value is None:
                raise S3Error("InvalidRequest", f"the trailer lacks x-amz-checksum-{alg}")
            wanted[alg] = value
        for alg, value in wanted.items():
            got = _b64(hashers[alg].digest())
            if got != value.strip():
                raise S3Error("BadDigest", f"the {alg.upper()} you specified did not match "
                                           "the calculated checksum")
            self.checksums[alg] = got
        self.md5 = md5.hex()


async def _body(content: StreamReader, length: int | None) -> AsyncIterator[bytes]:
    """A plain body in pieces of :data:`WHOLE` bytes (the last shorter) when its length
    is known, else as it arrives; a body shorter than its length ends early (the
    caller's count says ``IncompleteBody``)."""
    if length is None:
        async for piece in content.iter_chunked(WHOLE):
            yield piece
        return
    left = length
    while left > 0:
        try:
            piece = await content.readexactly(min(left, WHOLE))
        except asyncio.IncompleteReadError as short:
            if short.partial:
                yield short.partial
            return
        left -= len(piece)
        yield piece
    async for piece in content.iter_chunked(WHOLE):   # more than declared: counted
        yield piece


async def _whole(source: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``source``'s bytes in pieces of :data:`WHOLE` bytes (the last shorter): smaller
    pieces joined (one copy, where the write engine would copy them into a chunk
    buffer anyway), a whole piece passed as it is."""
    held: list[bytes] = []
    size = 0
    async for piece in source:
        if not held and len(piece) == WHOLE:
            yield piece
            continue
        held.append(piece)
        size += len(piece)
        while size >= WHOLE:
            joined = b"".join(held)
            yield joined[:WHOLE] if size > WHOLE else joined
            rest = joined[WHOLE:]
            held, size = ([rest] if rest else []), len(rest)
    if held:
        yield b"".join(held)


def _lanes(hashers: dict[str, Any]) -> list[dict[str, Any]]:
    """``hashers`` in the groups hashed side by side, one thread each: the MD5 alone,
    the rest together.  A piece waits for the slowest group, so a stream is hashed at
    the MD5's pace (1.23 CPU s a GiB here) rather than at the sum of every hash's (the
    MD5, SHA-256 and CRC32 of a boto3 PUT over http: 1.91 s a GiB, ~550 MB/s a stream).
    The CPU is the same: where no core is idle nothing is gained."""
    rest = {k: h for k, h in hashers.items() if k != "md5"}
    return [{"md5": hashers["md5"]}, rest] if rest else [hashers]


async def hashed(source: AsyncIterator[bytes], lanes: list[dict[str, Any]]
                 ) -> AsyncIterator[bytes]:
    """``source``'s pieces, each hashed by every hasher of ``lanes`` while it is written
    and the next one is read (the MD5 alone is ~1.2 CPU s a GiB): a piece of
    :data:`THREAD_AT` bytes or more on threads, one a lane (see :func:`_lanes`), a
    smaller one at once; one piece at a time, so that their order is kept."""
    hashing: asyncio.Future[Any] | None = None
    try:
        async for piece in source:
            if hashing is not None:
                await hashing
                hashing = None
            if len(piece) >= THREAD_AT and isinstance(piece, bytes):
                hashing = asyncio.gather(*(asyncio.to_thread(_update, lane, piece)
                                           for lane in lanes))
            else:
                for lane in lanes:
                    _update(lane, piece)
            yield piece
        if hashing is not None:
            await hashing
            hashing = None
    finally:
        if hashing is not None:     # the write failed: let the threads finish alone
            hashing.cancel()


def _update(hashers: dict[str, Any], piece: bytes) -> None:
    for h in hashers.values():
        h.update(piece)
