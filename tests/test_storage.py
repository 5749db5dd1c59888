"""The chunk file format and the chunk store, on a real directory (no servers)."""

from __future__ import annotations

import os
import struct
import time
import uuid
from pathlib import Path

import pytest

from stager.checksum import crc32c, from_hex, to_hex
from stager.errors import (
    BadRequest,
    ChecksumMismatch,
    ChunkNotFound,
    CorruptChunk,
    InsufficientStorage,
    UploadNotFound,
)
from stager.storage import ChunkStore, chunkstore
from stager.storage.chunkfile import BLOCK_SIZE, FOOTER_SIZE, MAGIC, build_trailer, read_meta

BS = BLOCK_SIZE


def cid(index: int = 0, file_id: str | None = None) -> str:
    return f"{file_id or uuid.uuid4().hex}.{index}"


@pytest.fixture
def store(tmp_path: Path) -> ChunkStore:
    return ChunkStore(tmp_path / "target")


@pytest.mark.parametrize("size", [0, 1, BS - 1, BS, BS + 1, 3 * BS + 17])
def test_file_layout_is_data_then_block_crcs_then_footer(store: ChunkStore, payload,
                                                          size: int) -> None:
    data = payload(size)
    chunk = cid()
    store.put(chunk, data, crc32c(data))
    raw = store.path_of(chunk).read_bytes()
    blocks = -(-size // BS)
    assert len(raw) == size + 4 * blocks + FOOTER_SIZE
    assert raw[:size] == data                       # data first: one sendfile serves it
    table = struct.unpack(f"<{blocks}I", raw[size:size + 4 * blocks])
    assert list(table) == [crc32c(data[i:i + BS]) for i in range(0, size, BS)]
    magic, block_size, data_len, crc, trailer_crc = struct.unpack("<4sIQII", raw[-FOOTER_SIZE:])
    assert (magic, block_size, data_len, crc) == (MAGIC, BS, size, crc32c(data))
    assert trailer_crc == crc32c(raw[size:-4])
    with store.open(chunk) as oc:
        assert oc.meta.data_len == size and oc.meta.crc == crc32c(data)
        assert oc.read(0, size) == data
    assert store.verify(chunk).data_len == size


def test_ranged_reads_verify_only_the_blocks_they_touch(store: ChunkStore, payload) -> None:
    data = payload(4 * BS)
    chunk = cid()
    store.put(chunk, data, crc32c(data))
    for start, length in [(0, 1), (BS - 1, 2), (BS, BS), (3 * BS + 5, BS - 5), (0, 4 * BS),
                          (17, 0)]:
        assert store.read(chunk, start, length) == data[start:start + length]
    _flip(store.path_of(chunk), 2 * BS + 7)          # damage block 2
    assert store.read(chunk, 0, 2 * BS) == data[:2 * BS]
    assert store.read(chunk, 3 * BS, BS) == data[3 * BS:]
    for start, length in [(2 * BS, 1), (2 * BS - 1, 2), (0, 4 * BS)]:
        with pytest.raises(CorruptChunk) as err:
            store.read(chunk, start, length)
        assert err.value.details["block"] == 2
        assert isinstance(err.value, OSError)
    with pytest.raises(CorruptChunk):
        store.verify(chunk)


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 1]))


@pytest.mark.parametrize("where", ["table", "footer-len", "footer-crc", "magic"])
def test_damaged_trailer_is_detected_on_open(store: ChunkStore, payload, where: str) -> None:
    data = payload(2 * BS + 3)
    chunk = cid()
    store.put(chunk, data, crc32c(data))
    path = store.path_of(chunk)
    size = path.stat().st_size
    offset = {"table": len(data) + 2, "footer-len": size - 14, "footer-crc": size - 1,
              "magic": size - FOOTER_SIZE}[where]
    _flip(path, offset)
    with pytest.raises(CorruptChunk):
        store.open(chunk)


@pytest.mark.parametrize("new_size", [0, 10, FOOTER_SIZE - 1, None])
def test_wrong_length_is_detected(store: ChunkStore, payload, new_size: int | None) -> None:
    data = payload(BS + 100)
    chunk = cid()
    store.put(chunk, data, crc32c(data))
    path = store.path_of(chunk)
    if new_size is None:
        with open(path, "ab") as fh:                    # one byte too many
            fh.write(b"\0")
    else:
        os.truncate(path, new_size)
    with pytest.raises(CorruptChunk):
        store.read(chunk, 0, 1)


def test_whole_chunk_crc_catches_a_swap_of_valid_blocks(tmp_path: Path, payload) -> None:
    """Blocks swapped with their table entries pass block checks; the whole CRC does not."""
    a, b = payload(BS), payload(BS)[::-1]
    data = a + b
    crc = crc32c(data)
    swapped = b + a
    trailer = bytearray(build_trailer(swapped, crc))      # a table for the swapped bytes...
    path = tmp_path / "c"
    path.write_bytes(swapped + bytes(trailer))            # ...but the original whole CRC
    fd = os.open(path, os.O_RDONLY)
    try:
        meta = read_meta(fd, os.fstat(fd).st_size, "c")
        from stager.storage.chunkfile import read_verified, verify_all

        assert read_verified(fd, meta, 0, 2 * BS) == swapped
        with pytest.raises(CorruptChunk):
            verify_all(fd, meta, "c")
    finally:
        os.close(fd)


@pytest.mark.parametrize("block_size", [4096, BLOCK_SIZE, 4 * BLOCK_SIZE])
@pytest.mark.parametrize("size", [0, 1, 4096 * 40 + 7, 3 * BLOCK_SIZE])
def test_trailers_of_any_block_size_are_read_and_checked(tmp_path: Path, payload,
                                                          block_size: int, size: int) -> None:
    """The footer and the block table come in one read when the blocks are ours or
    larger; a smaller block size (a longer table) is read and checked all the same,
    and a flipped table entry is caught either way."""
    data = payload(size)
    path = tmp_path / "c"
    trailer = build_trailer(data, crc32c(data), block_size)
    path.write_bytes(data + trailer)
    fd = os.open(path, os.O_RDONLY)
    try:
        meta = read_meta(fd, os.fstat(fd).st_size, "c")
        assert (meta.data_len, meta.block_size) == (size, block_size)
        assert len(meta.block_crcs) == -(-size // block_size)
        from stager.storage.chunkfile import read_verified

        assert read_verified(fd, meta, 0, size) == data
    finally:
        os.close(fd)
    if size:
        damaged = bytearray(trailer)
        damaged[0] ^= 1                                  # the first block's CRC
        path.write_bytes(data + bytes(damaged))
        fd = os.open(path, os.O_RDONLY)
        try:
            with pytest.raises(CorruptChunk, match="damaged trailer"):
                read_meta(fd, os.fstat(fd).st_size, "c")
        finally:
            os.close(fd)


def test_wrong_crc_stores_nothing(store: ChunkStore) -> None:
    chunk = cid()
    with pytest.raises(ChecksumMismatch) as err:
        store.put(chunk, b"data", crc32c(b"data") ^ 0xFFFF)
    assert err.value.details["chunk"] == chunk and isinstance(err.value, ValueError)
    assert store.list_chunks() == []
    assert not any(p.is_file() for p in store.chunks_dir.rglob("*"))
    with pytest.raises(ChunkNotFound):
        store.open(chunk)
    assert store.usage().chunks == 0 and store.usage().used == 0


def test_put_is_idempotent_and_usage_is_counted(store: ChunkStore) -> None:
    data = b"x" * 1000
    chunk = cid()
    for _ in range(3):
        store.put(chunk, data, crc32c(data))
    usage = store.usage()
    assert usage.chunks == 1 and usage.used == store.path_of(chunk).stat().st_size
    other = cid()
    store.put(other, b"y", crc32c(b"y"))
    assert store.usage().chunks == 2
    assert sorted(store.list_chunks()) == sorted([chunk, other])
    assert store.delete(chunk) is True and store.delete(chunk) is False
    assert store.usage().chunks == 1
    assert store.usage().used == store.path_of(other).stat().st_size


def test_fan_out_directories_and_purge(store: ChunkStore) -> None:
    fid = uuid.uuid4().hex
    for i in range(5):
        store.put(cid(i, fid), bytes([i]) * (i + 1), crc32c(bytes([i]) * (i + 1)))
    keep = cid()
    store.put(keep, b"k", crc32c(b"k"))
    assert store.path_of(cid(0, fid)) == store.chunks_dir / fid[:2] / fid[2:4] / f"{fid}.0"
    assert store.purge(fid) == 5
    assert store.list_chunks() == [keep]
    assert store.purge(fid) == 0
    assert store.purge(uuid.uuid4().hex) == 0


def test_a_purged_files_chunks_are_refused_for_a_while(store: ChunkStore,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that gave up can still have chunks on their way when its file is
    collected: they are refused, so none lands as an orphan."""
    fid = uuid.uuid4().hex
    store.put(cid(0, fid), b"a", crc32c(b"a"))
    assert store.purge(fid) == 1
    with pytest.raises(UploadNotFound):
        store.put(cid(1, fid), b"late", crc32c(b"late"))
    with pytest.raises(UploadNotFound):
        store.put_many([(cid(2, fid), b"late", crc32c(b"late"))])
    other = cid()
    store.put(other, b"b", crc32c(b"b"))                 # other files are taken
    assert store.list_chunks() == [other] and store.usage().chunks == 1
    later = time.monotonic() + chunkstore.PURGED_FOR + 1
    monkeypatch.setattr(chunkstore.time, "monotonic", lambda: later)
    store.purge(uuid.uuid4().hex)                       # forgets the marks past their time
    store.put(cid(1, fid), b"again", crc32c(b"again"))
    assert sorted(store.list_chunks()) == sorted([other, cid(1, fid)])


@pytest.mark.parametrize("many", [False, True])
def test_a_write_that_lands_after_its_files_purge_is_undone(store: ChunkStore, many: bool,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            ) -> None:
    """The purge runs while the chunk is being written (after its temporary file,
    before the rename): the purge does not see it, and the write, seeing the purge,
    removes what it installed."""
    fid = uuid.uuid4().hex
    chunk = cid(0, fid)
    replace = os.replace

    def purge_first(src: object, dst: object) -> None:
        assert store.purge(fid) == 0
        replace(src, dst)
    monkeypatch.setattr(chunkstore.os, "replace", purge_first)
    with pytest.raises(UploadNotFound):
        if many:
            store.put_many([(chunk, b"late", crc32c(b"late"))])
        else:
            store.put(chunk, b"late", crc32c(b"late"))
    monkeypatch.setattr(chunkstore.os, "replace", replace)
    assert store.list_chunks() == []
    assert (store.usage().chunks, store.usage().used) == (0, 0)
    assert not [p for p in store.chunks_dir.rglob("*") if p.is_file()]


def test_restart_rescans_and_removes_temporary_files(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path / "t")
    chunks = [cid(i) for i in range(3)]
    for c in chunks:
        store.put(c, c.encode(), crc32c(c.encode()))
    tmp = store.path_of(chunks[0]).with_name(f".{chunks[0]}.abcd1234.tmp")
    tmp.write_bytes(b"torn write")
    again = ChunkStore(tmp_path / "t")
    assert not tmp.exists()
    assert sorted(again.list_chunks()) == sorted(chunks)
    assert again.usage().chunks == 3 and again.usage().used == store.usage().used
    assert again.read(chunks[1], 0, len(chunks[1])) == chunks[1].encode()


def test_capacity_limit(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path / "t", capacity=10_000)
    store.put(cid(), b"a" * 5000, crc32c(b"a" * 5000))
    with pytest.raises(InsufficientStorage) as err:
        store.put(cid(), b"b" * 5000, crc32c(b"b" * 5000))
    assert isinstance(err.value, OSError) and err.value.errno == 28   # ENOSPC
    assert store.usage().chunks == 1
    assert store.usage().capacity == 10_000 and store.usage().free <= 5000


@pytest.mark.parametrize("bad", ["x.0", "../../etc.0", "a" * 32, "A" * 32 + ".0",
                                 "a" * 32 + ".-1", "a" * 32 + "/0", ""])
def test_chunk_ids_are_checked(store: ChunkStore, bad: str) -> None:
    with pytest.raises(BadRequest):
        store.put(bad, b"x", crc32c(b"x"))
    with pytest.raises(BadRequest):
        store.open(bad)


def test_checksum_helpers() -> None:
    assert crc32c(b"123456789") == 0xE3069283               # the CRC32C check value
    assert crc32c(b"6789", crc32c(b"12345")) == 0xE3069283   # continues
    assert to_hex(0xE3069283) == "e3069283" and from_hex("e3069283") == 0xE3069283
    for bad in ("", "123", "123456789"):
        with pytest.raises(ValueError):
            from_hex(bad)


def _batch_read(store: ChunkStore, items: list[tuple[str, int, int]]) -> bytes:
    from stager.data.batchread import BatchRead
    from stager.protocol.models import ReadItem

    batch = BatchRead(store, [ReadItem(*i) for i in items])
    try:
        return bytes(batch.read(batch.items))
    finally:
        batch.close()


def test_a_batched_read_reads_and_checks_each_block_once(store: ChunkStore, payload,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every other 16.5 KiB sample of a chunk (one DataLoader worker's share of a
    shuffled batch), a few to a block: the blocks they touch are read once, not
    once per sample."""
    import stager.storage.chunkfile as chunkfile

    data, other = payload(64 * BS + 100), payload(3 * BS)
    chunk, second = cid(), cid()
    store.put(chunk, data, crc32c(data))
    store.put(second, other, crc32c(other))
    step = 16 * 1024 + 512
    items = [(chunk, o, 16 * 1024) for o in range(512, len(data) - step, 2 * step)]
    read: list[int] = []
    real = os.preadv

    def counting(fd: int, buffers: list[memoryview], offset: int) -> int:
        read.append(sum(len(b) for b in buffers))
        return real(fd, buffers, offset)

    monkeypatch.setattr(chunkfile.os, "preadv", counting)
    assert _batch_read(store, items) == b"".join(data[o:o + n] for _, o, n in items)
    touched = {b for _, o, n in items for b in range(o // BS, (o + n - 1) // BS + 1)}
    # In reads of up to 1 MiB, each block once, but for a block two of them share
    # (a sample across a window's end); one read per sample, it was 2.4 times as much, in 124 reads.
    assert all(n <= 1 << 20 for n in read)
    assert len(touched) * BS <= sum(read) <= (len(touched) + len(read) - 1) * BS
    assert len(read) <= len(touched) * BS // (1 << 20) + 1

    # Out of order, two chunks taking turns, empty items, pieces across blocks and
    # one longer than a read window: the same bytes as one read per item.
    mixed = [(second, BS - 3, 9), (chunk, 5 * BS, 10), (chunk, 2 * BS, 7), (second, 0, 0),
             (chunk, 2 * BS + 7, BS), (second, 2 * BS, BS), (chunk, 0, len(data)),
             (chunk, 17, 0), (chunk, len(data) - 1, 1), (chunk, BS - 1, 2)]
    blobs = {chunk: data, second: other}
    assert _batch_read(store, mixed) == b"".join(blobs[c][o:o + n] for c, o, n in mixed)


def test_a_batched_read_checks_only_the_blocks_its_items_touch(store: ChunkStore,
                                                              payload) -> None:
    data = payload(8 * BS)
    chunk = cid()
    store.put(chunk, data, crc32c(data))
    _flip(store.path_of(chunk), 4 * BS + 9)          # damage block 4
    fine = [(chunk, 0, 10), (chunk, BS + 3, BS), (chunk, 3 * BS, BS), (chunk, 5 * BS, 2 * BS)]
    assert _batch_read(store, fine) == b"".join(data[o:o + n] for _, o, n in fine)
    for bad in ([(chunk, 3 * BS, BS), (chunk, 4 * BS - 1, 2)], [(chunk, 4 * BS + 20, 1)],
                [(chunk, 3 * BS + 5, 10), (chunk, 5 * BS, 10), (chunk, 4 * BS, 1)]):
        with pytest.raises(CorruptChunk) as err:
            _batch_read(store, bad)
        assert err.value.details["block"] == 4
