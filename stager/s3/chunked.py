"""The ``aws-chunked`` body decoder.

An ``aws-chunked`` body (``Content-Encoding: aws-chunked``, or any
``x-amz-content-sha256: STREAMING-…``) is a run of chunks::

    <hex size>[;chunk-signature=<64 hex>]\\r\\n<size bytes>\\r\\n
    ...
    0[;chunk-signature=<64 hex>]\\r\\n
    [<trailer name>:<value>\\r\\n ...][x-amz-trailer-signature:<64 hex>\\r\\n]
    \\r\\n

boto3 ≥ 1.36 sends its default CRC32 this way, in a trailer.  The decoder yields
the data in pieces of at most :data:`PIECE` bytes whatever the chunk size the
sender chose (memory stays bounded), and raises :class:`S3Error` on any fault: a
malformed size line, a body that ends early, data after the end.  A signed body
(``signatures``) has every chunk's signature checked, and a trailer it carries must
carry its own ``x-amz-trailer-signature``.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import StreamReader

from .auth import ChunkSignatures
from .errors import S3Error

PIECE = 1 << 20
MAX_LINE = 4096             # a size line or a trailer line
MAX_TRAILER = 16            # trailer lines
_SIZE = re.compile(rb"^([0-9a-fA-F]{1,16})(?:;chunk-signature=([0-9a-f]{64}))?$")


@dataclass
class Trailer:
    """What came after the last chunk: ``name`` (lower case) → value."""

    headers: dict[str, str] = field(default_factory=dict)


def _incomplete(what: str) -> S3Error:
    return S3Error("IncompleteBody", f"the aws-chunked body ended early ({what})")


async def _line(content: StreamReader) -> bytes:
    """One CRLF-terminated line, without its CRLF; bounded."""
    try:
        raw = await content.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise S3Error("InvalidArgument", "an aws-chunked line is too long") from None
    except ValueError:      # aiohttp: "Chunk too big"
        raise S3Error("InvalidArgument", "an aws-chunked line is too long") from None
    if not raw.endswith(b"\n"):
        raise _incomplete("in a chunk header")
    if len(raw) > MAX_LINE:
        raise S3Error("InvalidArgument", "an aws-chunked line is too long")
    return raw.rstrip(b"\r\n") if raw.endswith(b"\r\n") else raw[:-1]


async def _exactly(content: StreamReader, n: int) -> bytes:
    try:
        return await content.readexactly(n)
    except asyncio.IncompleteReadError:
        raise _incomplete("in a chunk's data") from None


async def decode(content: StreamReader, trailer: Trailer,
                 signatures: ChunkSignatures | None = None) -> AsyncIterator[bytes]:
    """The data of an ``aws-chunked`` body; ``trailer`` is filled once it ends.
    With ``signatures`` each chunk's signature is checked (signed streaming)."""
    while True:
        line = await _line(content)
        m = _SIZE.match(line)
        if m is None:
            raise S3Error("InvalidArgument",
                          f"a malformed aws-chunked size line {line[:80]!r}")
        size, signature = int(m.group(1), 16), m.group(2)
        if signatures is not None and signature is None:
            raise S3Error("SignatureDoesNotMatch", "a chunk without its signature")
        digest = hashlib.sha256() if signatures is not None else None
        left = size
        while left:
            piece = await _exactly(content, min(left, PIECE))
            left -= len(piece)
            if digest is not None:
                digest.update(piece)
            yield piece
        if signatures is not None:
            assert digest is not None and signature is not None
            signatures.chunk(digest.hexdigest(), signature.decode())
        if size == 0:
            break
        if await _exactly(content, 2) != b"\r\n":
            raise S3Error("InvalidArgument", "an aws-chunked chunk is not followed by CRLF")
    await _trailer(content, trailer, signatures)


async def _trailer(content: StreamReader, trailer: Trailer,
                   signatures: ChunkSignatures | None) -> None:
    lines: list[bytes] = []
    while True:
        if content.at_eof() and not lines:
            return          # "0\r\n" then the end: no trailer, no final CRLF
        line = await _line(content)
        if not line:
            break
        lines.append(line)
        if len(lines) > MAX_TRAILER:
            raise S3Error("InvalidArgument", "too many trailing headers")
    signed: list[bytes] = []
    if signatures is not None and lines and not any(
            line.lower().startswith(b"x-amz-trailer-signature:") for line in lines):
        raise S3Error("SignatureDoesNotMatch", "a signed body's trailer without its "
                      "x-amz-trailer-signature")
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep:
            raise S3Error("InvalidArgument", f"a malformed trailing header {line[:80]!r}")
        key = name.strip().lower().decode("latin-1")
        if key == "x-amz-trailer-signature":
            if signatures is not None:
                signatures.trailer(b"".join(s + b"\n" for s in signed),
                                   value.strip().decode("latin-1"))
            continue
        signed.append(line)
        trailer.headers[key] = value.strip().decode("latin-1")
    if await content.read(1):
        raise S3Error("InvalidArgument", "data after the end of the aws-chunked body")
