"""The aws-chunked decoder (``stager/s3/chunked.py``) alone, fed from a StreamReader.

Bounded pieces whatever the chunk size; signed chunks handed to the signature seam
(``stager/s3/auth.py``) one by one, and a signed trailer that must carry its own
signature.  Refusals of whole requests with bad bodies are in ``test_s3_gateway``
and ``test_s3_fuzz``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import zlib

import pytest
from aiohttp import StreamReader
from aiohttp.base_protocol import BaseProtocol

from stager.s3.chunked import Trailer, decode
from stager.s3.errors import S3Error


def crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


class Chain:
    """Records what the decoder hands the signature seam (stager/s3/auth.py)."""

    def __init__(self) -> None:
        self.chunks: list[tuple[str, str]] = []
        self.trailers: list[tuple[bytes, str]] = []

    def chunk(self, payload_sha256: str, signature: str) -> None:
        if signature == "f" * 64:
            raise S3Error("SignatureDoesNotMatch", "a wrong link")
        self.chunks.append((payload_sha256, signature))

    def trailer(self, trailer: bytes, signature: str) -> None:
        self.trailers.append((trailer, signature))


async def decoded(raw: bytes, chain: Chain | None = None) -> tuple[bytes, Trailer]:
    reader = StreamReader(BaseProtocol(asyncio.get_running_loop()), 2 ** 16,
                          loop=asyncio.get_running_loop())
    reader.feed_data(raw)
    reader.feed_eof()
    trailer = Trailer()
    out = b"".join([p async for p in decode(reader, trailer, chain)])  # type: ignore[arg-type]
    return out, trailer


async def test_signed_chunks_go_to_the_signature_seam_one_by_one() -> None:
    sig = "a" * 64
    raw = (b"5;chunk-signature=" + sig.encode() + b"\r\nhello\r\n"
           b"0;chunk-signature=" + sig.encode() + b"\r\n"
           b"x-amz-checksum-crc32:" + crc32_b64(b"hello").encode() + b"\r\n"
           b"x-amz-trailer-signature:" + b"b" * 64 + b"\r\n\r\n")
    chain = Chain()
    data, trailer = await decoded(raw, chain)
    assert data == b"hello"
    assert chain.chunks == [(hashlib.sha256(b"hello").hexdigest(), sig),
                            (hashlib.sha256(b"").hexdigest(), sig)]
    assert chain.trailers == [(b"x-amz-checksum-crc32:" + crc32_b64(b"hello").encode()
                               + b"\n", "b" * 64)]
    assert trailer.headers == {"x-amz-checksum-crc32": crc32_b64(b"hello")}
    with pytest.raises(S3Error) as err:
        await decoded(b"5\r\nhello\r\n0\r\n\r\n", Chain())
    assert err.value.code == "SignatureDoesNotMatch"
    with pytest.raises(S3Error) as err:
        await decoded(b"5;chunk-signature=" + b"f" * 64 + b"\r\nhello\r\n", Chain())
    assert err.value.code == "SignatureDoesNotMatch"


async def test_the_decoder_yields_bounded_pieces_of_a_huge_chunk() -> None:
    data = bytes(3 << 20)
    raw = b"%x\r\n" % len(data) + data + b"\r\n0\r\n\r\n"
    reader = StreamReader(BaseProtocol(asyncio.get_running_loop()), 2 ** 24,
                          loop=asyncio.get_running_loop())
    reader.feed_data(raw)
    reader.feed_eof()
    sizes = [len(p) async for p in decode(reader, Trailer())]
    assert sum(sizes) == len(data) and max(sizes) <= 1 << 20


async def test_a_signed_trailer_must_carry_its_signature() -> None:
    sig = "a" * 64
    raw = (b"5;chunk-signature=" + sig.encode() + b"\r\nhello\r\n"
           b"0;chunk-signature=" + sig.encode() + b"\r\n"
           b"x-amz-checksum-crc32:" + crc32_b64(b"hello").encode() + b"\r\n\r\n")
    with pytest.raises(S3Error) as err:
        await decoded(raw, Chain())
    assert err.value.code == "SignatureDoesNotMatch"
