"""The on-disk format of one chunk: raw bytes, then a checksum trailer.

::

    [ data: data_len bytes ][ block CRC32Cs: u32 LE × ceil(data_len / block) ][ footer: 24 B ]
    footer = magic "STGC" | u32 block_size | u64 data_len | u32 crc32c(data) | u32 crc32c(trailer)

The data comes first so a whole-chunk GET is one ``sendfile`` of
``[0, data_len)``; the per-block CRCs let a ranged read verify only the blocks
it touches.  The footer's own CRC covers the block table and the footer, so a
torn or flipped trailer is detected too.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from ..checksum import crc32c
from ..errors import CorruptChunk

MAGIC = b"STGC"
BLOCK_SIZE = 64 * 1024
_FOOTER = struct.Struct("<4sIQII")
FOOTER_SIZE = _FOOTER.size


@dataclass(frozen=True)
class ChunkMeta:
    data_len: int
    crc: int
    block_size: int
    block_crcs: tuple[int, ...]

    @property
    def file_size(self) -> int:
        return self.data_len + 4 * len(self.block_crcs) + FOOTER_SIZE


def build_trailer(data: memoryview | bytes, crc: int, block_size: int = BLOCK_SIZE) -> bytes:
    view = memoryview(data)
    blocks = [crc32c(view[i:i + block_size]) for i in range(0, len(view), block_size)]
    table = struct.pack(f"<{len(blocks)}I", *blocks)
    head = _FOOTER.pack(MAGIC, block_size, len(view), crc, 0)[:-4]
    return table + head + struct.pack("<I", crc32c(table + head))


def read_meta(fd: int, file_size: int, name: str = "") -> ChunkMeta:
    """Parse and check the trailer of an open chunk file."""
    if file_size < FOOTER_SIZE:
        raise CorruptChunk(f"chunk {name} is truncated", chunk=name)
    # One read takes the footer and the block table of a chunk with our block size
    # (or a larger one): the table has at most a word per BLOCK_SIZE of the file.
    want = min(file_size, FOOTER_SIZE + 4 * -(-file_size // BLOCK_SIZE))
    tail = os.pread(fd, want, file_size - want)
    if len(tail) != want:
        raise CorruptChunk(f"chunk {name} is truncated", chunk=name)
    magic, block_size, data_len, crc, trailer_crc = _FOOTER.unpack_from(
        tail, want - FOOTER_SIZE)
    if magic != MAGIC or block_size <= 0:
        raise CorruptChunk(f"chunk {name} has no valid trailer", chunk=name)
    nblocks = -(-data_len // block_size)
    if data_len + 4 * nblocks + FOOTER_SIZE != file_size:
        raise CorruptChunk(f"chunk {name} has the wrong length", chunk=name)
    if FOOTER_SIZE + 4 * nblocks <= want:
        trailer = tail[want - FOOTER_SIZE - 4 * nblocks:]
    else:                                   # smaller blocks than ours: a longer table
        trailer = os.pread(fd, file_size - data_len, data_len)
    if crc32c(trailer[:-4]) != trailer_crc:
        raise CorruptChunk(f"chunk {name} has a damaged trailer", chunk=name)
    blocks = struct.unpack_from(f"<{nblocks}I", trailer)
    return ChunkMeta(data_len=data_len, crc=crc, block_size=block_size, block_crcs=blocks)


def read_verified(fd: int, meta: ChunkMeta, offset: int, length: int, name: str = "") -> bytes:
    """``length`` bytes at ``offset``, after checking every block they touch."""
    if length <= 0:
        return b""
    start, stop = block_span(meta, offset, length)
    blocks = memoryview(bytearray(stop - start))
    read_blocks_verified(fd, meta, start, blocks, name)
    return bytes(blocks[offset - start:offset - start + length])


def block_span(meta: ChunkMeta, offset: int, length: int) -> tuple[int, int]:
    """``[start, stop)`` of the whole blocks a read of ``length`` at ``offset`` touches."""
    bs = meta.block_size
    first, last = offset // bs, (offset + max(length, 1) - 1) // bs
    return first * bs, min((last + 1) * bs, meta.data_len)


def read_blocks_verified(fd: int, meta: ChunkMeta, start: int, blocks: memoryview,
                         name: str = "") -> None:
    """Fill ``blocks`` with the chunk's whole blocks from ``start`` (a block
    boundary; ``blocks`` ends at one or at the data's end) and check each one."""
    if os.preadv(fd, [blocks], start) != len(blocks):
        raise CorruptChunk(f"chunk {name} is truncated", chunk=name)
    bs = meta.block_size
    for i in range(0, len(blocks), bs):
        block = (start + i) // bs
        if crc32c(blocks[i:i + bs]) != meta.block_crcs[block]:
            raise CorruptChunk(f"chunk {name} failed its checksum at block {block}",
                               chunk=name, block=block)


def verify_all(fd: int, meta: ChunkMeta, name: str = "") -> None:
    """Read the whole chunk and check every block and the whole-chunk CRC."""
    crc = 0
    bs = meta.block_size
    for block, expected in enumerate(meta.block_crcs):
        start = block * bs
        piece = os.pread(fd, min(bs, meta.data_len - start), start)   # not into the trailer
        if crc32c(piece) != expected:
            raise CorruptChunk(f"chunk {name} failed its checksum at block {block}",
                               chunk=name, block=block)
        crc = crc32c(piece, crc)
    if crc != meta.crc:
        raise CorruptChunk(f"chunk {name} failed its checksum", chunk=name)
