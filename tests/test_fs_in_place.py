"""Sequential reads of whole chunks received straight into the ``bytes`` they return
(``AsyncReadFile(in_place=True)``, what the ``stager://`` filesystem's files use)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from stager import AsyncClient
from stager.client import AsyncReadFile
from stager.client.fileio import IN_PLACE_MIN
from stager.config import load_config
from stager.fs import StagerFileSystem
from stager.protocol.models import LayoutSpec
from stager.testing import ThreadCluster

KiB = 1024
CHUNK = 64 * KiB


@pytest.fixture(scope="module")
def fs(cluster: ThreadCluster) -> Iterator[StagerFileSystem]:
    fs = StagerFileSystem(cluster.meta_url, config=load_config(env={}), skip_instance_cache=True)
    yield fs
    fs.close()


async def test_a_run_of_whole_chunk_reads_returns_the_received_bytes(
        aclient: AsyncClient, ns: str, payload) -> None:
    data = payload(CHUNK * 40 + 7)
    async with await _opened(aclient, f"{ns}/f", data, in_place=True) as f:
        got = [await f.read_parts(2 * CHUNK, reuse=True) for _ in range(6)]
        # the first two reads come before the run; then each is one piece, whole
        assert all(len(parts) == 1 and type(parts[0]) is bytes for parts in got[2:])
        assert b"".join(b"".join(p) for p in got) == data[:12 * CHUNK]
        rest = await f.read_parts(-1, reuse=True)
    assert b"".join(rest) == data[12 * CHUNK:]


async def test_reads_outside_the_stream_return_the_received_bytes(
        aclient: AsyncClient, ns: str, payload) -> None:
    data = payload(IN_PLACE_MIN * 3 + 3)
    async with await _opened(aclient, f"{ns}/f", data, in_place=True) as f:
        for at, n in ((5 * CHUNK + 9, IN_PLACE_MIN), (CHUNK - 1, IN_PLACE_MIN + 2),
                      (0, len(data))):
            f.seek(at)
            parts = await f.read_parts(n, reuse=True)
            assert len(parts) == 1 and type(parts[0]) is bytes and parts[0] == data[at:at + n]


async def test_without_in_place_the_parts_are_lent_views(aclient: AsyncClient, ns: str,
                                                         payload) -> None:
    data = payload(CHUNK * 12)
    async with await _opened(aclient, f"{ns}/f", data) as f:
        got = [await f.read_parts(2 * CHUNK) for _ in range(6)]
    assert all(type(part) is memoryview for parts in got[2:] for part in parts)
    assert b"".join(b"".join(p) for p in got) == data


def test_bytes_returned_never_change(fs: StagerFileSystem, ns: str, payload) -> None:
    # a piece handed out is never read into again: not by the readahead, not after
    # a seek restarts the stream, not by a cancelled read when the file closes
    data = payload(CHUNK * 64 + 100)
    fs.pipe(f"{ns}/f", data, chunk_size="64KiB")
    kept: list[tuple[int, bytes]] = []
    with fs.open(f"{ns}/f", "rb") as f:
        for _ in range(10):
            kept.append((f.tell(), f.read(2 * CHUNK)))
        f.seek(CHUNK * 30)
        for _ in range(4):
            kept.append((f.tell(), f.read(2 * CHUNK)))
    gc.collect()
    fs.cat_file(f"{ns}/f")      # more reads through the same client after the close
    for at, piece in kept:
        assert piece == data[at:at + 2 * CHUNK]


@pytest.mark.parametrize("step", [CHUNK, 2 * CHUNK, 3 * CHUNK, 2 * CHUNK + 1])
def test_runs_of_any_whole_or_odd_size_read_the_file(fs: StagerFileSystem, ns: str,
                                                     payload, step: int) -> None:
    data = payload(CHUNK * 21 + 5)       # the last piece shorter than a step
    fs.pipe(f"{ns}/f", data, chunk_size="64KiB")
    with fs.open(f"{ns}/f", "rb") as f:
        parts = [f.read(step) for _ in range(4)]
        parts.append(f.read(100))       # smaller than a piece: a slice of one
        parts.append(f.read(step))       # then the rest of that piece and the next
        while part := f.read(step):
            parts.append(part)
        assert f.read(step) == b"" and f.tell() == len(data)
        f.seek(len(data) - 10)
        assert f.read(step) == data[-10:]
    assert b"".join(parts) == data


def test_read_all_after_a_run(fs: StagerFileSystem, ns: str, payload) -> None:
    data = payload(CHUNK * 16)
    fs.pipe(f"{ns}/f", data, chunk_size="64KiB")
    with fs.open(f"{ns}/f", "rb") as f:
        head = b"".join(f.read(2 * CHUNK) for _ in range(4))
        assert head + f.read() == data


async def _opened(client: AsyncClient, path: str, data: bytes, **options: bool
                  ) -> AsyncReadFile:
    """``data`` stored at ``path`` in chunks of CHUNK, opened for reading as a run of
    sequential reads starts after two."""
    await client.pipe(path, data, layout=LayoutSpec(chunk_size=CHUNK))
    return AsyncReadFile(client, await client.stat(path), stream_after=2,
                         large_reads_stream=False, **options)


@pytest.mark.parametrize("cache_type", ["none", "readahead", "bytes"])
def test_readinto_fills_the_buffer_given(fs: StagerFileSystem, ns: str, payload,
                                         cache_type: str) -> None:
    data = payload(CHUNK * 9 + 17)
    fs.pipe(f"{ns}/f", data, chunk_size="64KiB")
    out = bytearray(len(data) + 100)
    view = memoryview(out)
    with fs.open(f"{ns}/f", "rb", cache_type=cache_type) as f:
        n = 0
        while got := f.readinto(view[n:n + 2 * CHUNK]):
            n += got
        assert n == len(data) and out[:n] == data and f.tell() == n
        f.seek(CHUNK + 5)
        small = bytearray(10)
        assert f.readinto(small) == 10 and small == data[CHUNK + 5:CHUNK + 15]
        assert f.read(7) == data[CHUNK + 15:CHUNK + 22]     # reads go on from there
    with pytest.raises(ValueError):
        f.readinto(small)
