"""Bytes in, the same bytes out: every size around chunk boundaries, every way of use."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import STORES, cluster_on_each_store

from stager import AsyncClient, Client
from stager.protocol.models import LayoutSpec
from stager.testing import ThreadCluster

SMALL = 64 * 1024            # a small chunk size, so boundaries are cheap to cross
DEFAULT = 4 * 1024 * 1024    # the default chunk size


# Named with an underscore, so that the modules that import these tests with ``*``
# (tests/test_tls_roundtrip.py, tests/auth/) keep the cluster fixture of their own.
_cluster = pytest.fixture(scope="module", params=STORES, name="cluster")(
    cluster_on_each_store)


def boundary_sizes(chunk: int) -> list[int]:
    return [0, 1, chunk - 1, chunk, chunk + 1, chunk * 7 // 2]


@pytest.mark.parametrize("size", boundary_sizes(SMALL))
def test_client_round_trip_small_chunks(client: Client, ns: str, payload, size: int) -> None:
    data = payload(size)
    info = client.pipe(f"{ns}/f.bin", data, layout=LayoutSpec(chunk_size=SMALL))
    assert info.size == size
    assert info.layout is not None and info.layout.chunk_size == SMALL
    assert client.cat(f"{ns}/f.bin") == data
    assert client.stat(f"{ns}/f.bin", cached=False).size == size


@pytest.mark.parametrize("size", boundary_sizes(DEFAULT))
def test_client_round_trip_default_chunks(client: Client, ns: str, payload, size: int) -> None:
    data = payload(size)
    info = client.pipe(f"{ns}/f.bin", data)
    assert info.layout is not None and info.layout.chunk_size == DEFAULT
    assert client.cat(f"{ns}/f.bin") == data
    if size > 2:   # a ranged read across the whole file but the first and last byte
        assert client.cat(f"{ns}/f.bin", 1, size - 1) == data[1:-1]


@pytest.mark.parametrize("size", boundary_sizes(SMALL))
async def test_async_client_round_trip(aclient: AsyncClient, ns: str, payload,
                                       size: int) -> None:
    data = payload(size)
    await aclient.pipe(f"{ns}/f.bin", data, layout=LayoutSpec(chunk_size=SMALL))
    assert await aclient.cat(f"{ns}/f.bin") == data
    out = bytearray(size)
    assert await aclient.read_into(f"{ns}/f.bin", memoryview(out)) == size
    assert out == data
    async with await aclient.open(f"{ns}/f.bin", "rb") as f:
        assert await f.read() == data


def test_100mib_random_put_get(client: Client, ns: str, tmp_path: Path) -> None:
    """100 MiB of random bytes from a local file, through put and get, byte-exact."""
    src, dst = tmp_path / "src.bin", tmp_path / "dst.bin"
    data = os.urandom(100 * 1024 * 1024)
    src.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    del data
    [info] = client.put(src, f"{ns}/big.bin")
    assert info.size == 100 * 1024 * 1024
    assert info.layout is not None and info.layout.chunk_size == DEFAULT
    assert client.get(f"{ns}/big.bin", dst) == info.size
    assert hashlib.sha256(dst.read_bytes()).hexdigest() == digest
    # The same bytes through one parallel ranged read straddling many chunks.
    part = client.cat(f"{ns}/big.bin", DEFAULT - 7, 9 * DEFAULT + 3)
    with open(src, "rb") as fh:
        fh.seek(DEFAULT - 7)
        assert part == fh.read(8 * DEFAULT + 10)


def test_open_wb_irregular_writes_then_rb_random_seeks(client: Client, ns: str,
                                                       payload) -> None:
    size = SMALL * 9 + 12345
    data = payload(size)
    rng = random.Random(7)
    path = f"{ns}/w.bin"
    with client.open(path, "wb", layout=LayoutSpec(chunk_size=SMALL)) as f:
        pos = 0
        while pos < size:
            n = rng.choice([1, 17, SMALL - 1, SMALL, SMALL + 3, 100_000])
            assert f.write(data[pos:pos + n]) == len(data[pos:pos + n])
            pos += n
        assert f.tell() == size
        assert not client.exists(path)          # visible only after close
    assert f.info is not None and f.info.size == size

    with client.open(path, "rb") as r:
        assert r.seekable() and r.size == size
        for _ in range(60):
            start = rng.randrange(0, size + 10)
            n = rng.choice([0, 1, 100, SMALL, 3 * SMALL + 5, size])
            assert r.seek(start) == start
            assert r.read(n) == data[start:start + n]
            assert r.tell() == max(start, min(start + n, size))
        r.seek(-10, io.SEEK_END)
        assert r.read() == data[-10:]
        r.seek(5)
        r.seek(5, io.SEEK_CUR)
        assert r.read(3) == data[10:13]
        r.seek(0)
        pieces = []       # sequential small reads: served from the readahead stream
        while chunk := r.read(7777):
            pieces.append(chunk)
        assert b"".join(pieces) == data
        r.seek(SMALL - 2)
        buf = bytearray(10)
        assert r.readinto(buf) == 10 and buf == data[SMALL - 2:SMALL + 8]


async def test_async_open_wb_and_rb(aclient: AsyncClient, ns: str, payload) -> None:
    data = payload(SMALL * 3 + 5)
    async with await aclient.open(f"{ns}/a.bin", "wb", layout=LayoutSpec(chunk_size=SMALL)) as f:
        for i in range(0, len(data), 10_000):
            await f.write(data[i:i + 10_000])
    f = await aclient.open(f"{ns}/a.bin", "rb")
    f.seek(SMALL + 1)
    assert await f.read(SMALL) == data[SMALL + 1:2 * SMALL + 1]
    f.seek(0)
    assert await f.read() == data
    await f.close()
    with pytest.raises(ValueError):
        await f.read()


async def test_sequential_reads_refill_only_the_pieces_given_back(
        aclient: AsyncClient, ns: str, payload) -> None:
    """``read_parts(reuse=True)`` lets the readahead refill the buffers of earlier
    parts; parts read without it are the caller's and keep their bytes."""
    data = payload(SMALL * 40 + 123)
    await aclient.pipe(f"{ns}/r.bin", data, layout=LayoutSpec(chunk_size=SMALL))
    step = SMALL * 3 // 2 + 7                   # reads that end inside a piece

    async def read_all(reuse: bool) -> tuple[bytes, list[list[memoryview]]]:
        kept: list[list[memoryview]] = []
        got = bytearray()
        async with await aclient.open(f"{ns}/r.bin", "rb") as f:
            while parts := await f.read_parts(step, reuse=reuse):
                got += b"".join(parts)
                kept.append(parts)
        return bytes(got), kept

    got, kept = await read_all(reuse=False)
    assert got == data
    assert b"".join(b"".join(parts) for parts in kept) == data    # nothing refilled
    got, kept = await read_all(reuse=True)
    assert got == data
    buffers = [p.obj for parts in kept for p in parts]
    assert len({id(b) for b in buffers}) < len(buffers) // 2    # the same few buffers again


@pytest.mark.parametrize("size", boundary_sizes(SMALL))
def test_gateway_put_get_round_trip(cluster: ThreadCluster, http, ns: str, payload,
                                    size: int) -> None:
    data = payload(size)
    url = f"/v1/files{ns}/g.bin"
    put = http(cluster.meta_url, "PUT", f"{url}?chunk_size={SMALL}", body=data)
    assert put.status == 201, put.body
    assert put.json()["size"] == size
    assert put.json()["layout"]["chunk_size"] == SMALL
    got = http(cluster.meta_url, "GET", url)
    assert got.status == 200
    assert got.body == data
    assert got.headers["Content-Length"] == str(size)


def test_client_reads_what_the_gateway_wrote_and_back(client: Client, cluster: ThreadCluster,
                                                      http, ns: str, payload) -> None:
    data = payload(DEFAULT + 99)
    assert http(cluster.meta_url, "PUT", f"/v1/files{ns}/x.bin", body=data).status == 201
    assert client.cat(f"{ns}/x.bin") == data
    client.pipe(f"{ns}/y.bin", data[::-1])
    assert http(cluster.meta_url, "GET", f"/v1/files{ns}/y.bin").body == data[::-1]


def test_concurrent_writers_and_readers(client: Client, ns: str, payload) -> None:
    """8 writers and 8 readers at once, on one client (one loop thread), all byte-exact."""
    blobs = {i: payload(SMALL * (i + 2) + i) for i in range(16)}
    for i in range(8, 16):                       # what the readers will read
        client.pipe(f"{ns}/r{i}.bin", blobs[i], layout=LayoutSpec(chunk_size=SMALL))
    errors: list[BaseException] = []
    results: dict[int, bytes] = {}
    barrier = threading.Barrier(16)

    def writer(i: int) -> None:
        barrier.wait()
        client.pipe(f"{ns}/w{i}.bin", blobs[i], layout=LayoutSpec(chunk_size=SMALL))

    def reader(i: int) -> None:
        barrier.wait()
        for _ in range(3):
            results[i] = client.cat(f"{ns}/r{i}.bin")
            assert results[i] == blobs[i]

    def guarded(fn: Callable[[int], None], i: int) -> None:
        try:
            fn(i)
        except BaseException as exc:       # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(writer if i < 8 else reader, i))
               for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for i in range(8):
        assert client.cat(f"{ns}/w{i}.bin") == blobs[i]


async def test_concurrent_async_tasks_on_separate_clients(cluster: ThreadCluster, ns: str,
                                                          payload) -> None:
    """Independent clients (as separate ranks would be) writing and reading at once."""
    clients = [AsyncClient(cluster.meta_url) for _ in range(4)]
    try:
        async def work(k: int) -> None:
            c = clients[k % len(clients)]
            data = payload(SMALL * 5 + k)
            await c.pipe(f"{ns}/c{k}.bin", data, layout=LayoutSpec(chunk_size=SMALL))
            got = await asyncio.gather(*(c.cat(f"{ns}/c{k}.bin", j, j + SMALL + 1)
                                         for j in range(0, len(data), SMALL)))
            for j, part in zip(range(0, len(data), SMALL), got, strict=True):
                assert part == data[j:j + SMALL + 1]

        await asyncio.gather(*(work(k) for k in range(16)))
    finally:
        await asyncio.gather(*(c.close() for c in clients))


def test_file_overwrite_replaces_content(client: Client, ns: str, payload) -> None:
    client.pipe(f"{ns}/o.bin", payload(SMALL * 2), layout=LayoutSpec(chunk_size=SMALL))
    client.pipe(f"{ns}/o.bin", b"short")
    assert client.cat(f"{ns}/o.bin") == b"short"
    with pytest.raises(FileExistsError):
        client.pipe(f"{ns}/o.bin", b"again", overwrite=False)
    assert client.cat(f"{ns}/o.bin") == b"short"
