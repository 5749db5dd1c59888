"""Indexing tar shards: the plain-header parser lists exactly what ``tarfile`` lists,
and hands every other kind of archive to ``tarfile``; large members are not read."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import pytest
from fsspec.asyn import sync

from stager import Client
from stager.errors import BadRequest
from stager.loader.formats.base import SeekableRaw
from stager.loader.formats.tar import (
    SMALL_READ,
    SPARSE_GAP,
    _plain_members,
    _scan,
    index_shard,
)
from stager.protocol.models import LayoutSpec


class Memory(SeekableRaw):
    """An archive in memory, read as the shard reader reads one."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.data, self.size, self.pos = data, len(data), 0

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        chunk = self.data[self.pos:self.pos + len(out)]
        out[:len(chunk)] = chunk
        self.pos += len(chunk)
        return len(chunk)


def archive(fmt: int, members: list[tuple[str, bytes | None]], **kw: Any) -> bytes:
    """A tar of ``(name, data)`` members (``None``: a directory)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt, **kw) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def by_tarfile(data: bytes) -> list[tuple[str, int, int]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        return [(m.name, m.offset_data, m.size) for m in tar if m.isfile()]


PLAIN = [("d", None), ("d/a.jpg", b"x" * 1000), ("d/a.cls", b"7"), ("d/b.jpg", b""),
         ("d/b.cls", b"8" * 512), ("e/" + "p" * 90 + "/" + "n" * 90 + ".bin", b"y" * 513),
         ("caf\u00e9/c.txt", b"z" * 3)]


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT])
def test_plain_headers_are_parsed_here_as_tarfile_reads_them(fmt: int) -> None:
    # a name over 100 bytes: ustar splits it into prefix and name, GNU writes a
    # long-name record (not plain: see below)
    members = PLAIN if fmt == tarfile.USTAR_FORMAT else [m for m in PLAIN if len(m[0]) < 100]
    data = archive(fmt, members)
    got = _plain_members(Memory(data))
    assert got is not None and got == by_tarfile(data)
    assert len(got) == sum(d is not None for _, d in members)
    assert _scan(Memory(data), "x.tar") == got
    # without the end-of-archive blocks, as a cut-off writer leaves it
    last = got[-1]
    cut = data[:last[1] + -(-last[2] // 512) * 512]
    assert _plain_members(Memory(cut)) == by_tarfile(cut) == got


@pytest.mark.parametrize("members, fmt", [
    ([("l/" + "x" * 120 + ".bin", b"1")], tarfile.GNU_FORMAT),       # GNU long name record
    ([("l/" + "x" * 120 + ".bin", b"1")], tarfile.PAX_FORMAT),       # pax header
    ([("caf\u00e9.bin", b"1"), ("b.bin", b"2")], tarfile.PAX_FORMAT),
])
def test_other_headers_go_to_tarfile(members: list[tuple[str, bytes]], fmt: int) -> None:
    data = archive(fmt, members)
    assert _plain_members(Memory(data)) is None
    assert _scan(Memory(data), "x.tar") == by_tarfile(data) != []


def test_links_go_to_tarfile() -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("a.bin")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
        link = tarfile.TarInfo("b.bin")
        link.type, link.linkname = tarfile.SYMTYPE, "a.bin"
        tar.addfile(link)
    data = out.getvalue()
    assert _plain_members(Memory(data)) is None
    assert _scan(Memory(data), "x.tar") == by_tarfile(data) == [("a.bin", 512, 3)]


def test_damaged_archives_get_tarfile_s_answer() -> None:
    data = bytearray(archive(tarfile.USTAR_FORMAT, PLAIN))
    # a bad checksum in the second member: tarfile stops there (a later header)
    second = by_tarfile(bytes(data))[0][1] + 1024
    damaged = bytearray(data)
    damaged[second + 10] ^= 0xFF
    assert _plain_members(Memory(bytes(damaged))) is None
    assert _scan(Memory(bytes(damaged)), "x.tar") == by_tarfile(bytes(damaged))
    # a header cut short, and nothing at all: refused as before
    for bad in (bytes(data[:700]), b"", bytes(512) + bytes(data)):
        assert _plain_members(Memory(bad)) is None
        try:
            expected: Any = by_tarfile(bad)
        except tarfile.TarError:
            with pytest.raises(BadRequest, match="not a readable tar"):
                _scan(Memory(bad), "x.tar")
        else:
            assert _scan(Memory(bad), "x.tar") == expected
    # the first header damaged
    first = bytearray(data)
    first[3] ^= 0xFF
    with pytest.raises(BadRequest, match="not a readable tar"):
        _scan(Memory(bytes(first)), "x.tar")


def read_from_targets(client: Client) -> int:
    return sum(c.bytes_read for c in client.aio.plane.counters.values())


@pytest.mark.parametrize("member", [1 << 20, 16 << 10])
def test_indexing_skips_large_members_unread(client: Client, ns: str, member: int) -> None:
    """A shard of large members is indexed by a small read at each header after a
    large member, not by reading it whole; one of small members is read in
    windows (after a small first read), as before."""
    data = archive(tarfile.USTAR_FORMAT,
                   [(f"s{i:03d}.{ext}", bytes([i]) * (member if ext == "bin" else 10))
                    for i in range(12) for ext in ("bin", "cls")])
    client.pipe(f"{ns}/shard.tar", data, layout=LayoutSpec(chunk_size=256 << 10))
    info = client.stat(f"{ns}/shard.tar")
    before = read_from_targets(client)
    got = sync(client.loop, index_shard, client.aio, info, None)
    assert got == by_tarfile(data)
    read = read_from_targets(client) - before
    if member > SPARSE_GAP:
        assert read <= (12 + 1) * SMALL_READ < len(data) / 10
    else:
        assert len(data) <= read <= len(data) + SMALL_READ
