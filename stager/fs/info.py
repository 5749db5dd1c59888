"""What ``info``/``ls`` say of a path, in fsspec's terms, and the whole-file checksum.

stager stores one CRC32C per chunk.  ``info`` reports both those and the
CRC32C of the whole file, folded from the chunk CRCs without reading a byte
(the same value ``crc32c(whole file)`` gives, and what GCS calls ``crc32c``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from ..protocol.models import FileInfo

_POLY = 0x82F63B78          # CRC32C, reflected
_MAX_LOG = 48               # operators for up to 2**48 zero bytes


def _times(matrix: tuple[int, ...], vector: int) -> int:
    """The GF(2) matrix ``matrix`` (32 columns) applied to ``vector``."""
    out = 0
    i = 0
    while vector:
        if vector & 1:
            out ^= matrix[i]
        vector >>= 1
        i += 1
    return out


def _square(matrix: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(_times(matrix, matrix[n]) for n in range(32))


@lru_cache(maxsize=1)
def _zero_byte_operators() -> tuple[tuple[int, ...], ...]:
    """``ops[k]`` advances a CRC over ``2**k`` zero bytes (zlib's crc32_combine idea)."""
    one_bit = (_POLY,) + tuple(1 << n for n in range(31))
    op = _square(_square(_square(one_bit)))        # 8 zero bits: one byte
    ops = [op]
    for _ in range(_MAX_LOG):
        op = _square(op)
        ops.append(op)
    return tuple(ops)


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC32C of ``A + B`` from ``crc(A)``, ``crc(B)`` and ``len(B)``."""
    ops = _zero_byte_operators()
    k = 0
    while len2:
        if len2 & 1:
            crc1 = _times(ops[k], crc1)
        len2 >>= 1
        k += 1
    return crc1 ^ crc2


def whole_file_crc32c(checksums: tuple[int, ...], chunk_size: int, size: int) -> int:
    """The CRC32C of a file from its per-chunk CRC32Cs."""
    crc = 0
    for index, chunk_crc in enumerate(checksums):
        length = min(chunk_size, size - index * chunk_size)
        crc = crc32c_combine(crc, chunk_crc, length)
    return crc


def to_fsspec(info: FileInfo) -> dict[str, Any]:
    """An fsspec info dict: name, size, type, mtime, and stager's extras.

    Files carry ``checksum`` (``"crc32c:<8 hex>"`` of the whole file, when the
    chunk checksums are known), ``chunk_checksums`` (CRC32C per chunk, hex),
    ``file_id`` and ``layout``; directories carry ``default_layout`` when set.
    """
    out: dict[str, Any] = {"name": info.path, "size": info.size, "type": info.type,
                           "mtime": info.mtime}
    if info.is_dir:
        if info.default_layout is not None and info.default_layout.to_json():
            out["default_layout"] = info.default_layout.to_json()
        return out
    out["file_id"] = info.file_id
    if info.layout is not None:
        out["layout"] = info.layout.to_json()
    if info.checksums is not None and info.layout is not None:
        out["chunk_checksums"] = [f"{c:08x}" for c in info.checksums]
        crc = whole_file_crc32c(info.checksums, info.layout.chunk_size, info.size)
        out["checksum"] = f"crc32c:{crc:08x}"
    return out
