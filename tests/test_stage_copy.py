"""The large-file copy path without copies: source reads into reused chunk buffers
(raw ranged GETs for plain http), chunks sent from those buffers, and data servers
that read each body into one (reused) buffer."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stager import AsyncClient
from stager.checksum import crc32c
from stager.client.transfer import Buffers, copy_in
from stager.dataplane import DataPlane, PlaneOptions, make_session
from stager.errors import SourceError, TargetUnavailable
from stager.protocol.models import LayoutSpec
from stager.sources.httpraw import RawHttp
from stager.sources.open import open_source
from stager.sources.source import AsyncSource, ThreadSource
from stager.testing import ThreadCluster
from stager.testing.httpserver import HttpServer

MiB = 1 << 20


def new_chunk(index: int = 0) -> str:
    return f"{uuid.uuid4().hex}.{index}"


@pytest.fixture
def data_url(cluster: ThreadCluster) -> str:
    server = cluster.data[0]
    assert server is not None
    return server.url


# -- data server: bodies ------------------------------------------------------------------
def test_reused_body_buffers_keep_every_chunk_whole(http, data_url: str, payload) -> None:
    """Same-size bodies one after another (each into a reused buffer), then one sent
    with chunked encoding (no length): every chunk reads back as sent."""
    sent = {}
    for i in range(6):
        data = payload(MiB + i * 7)[:MiB]           # same size, different bytes
        chunk = new_chunk(i)
        r = http(data_url, "PUT", f"/v1/chunks/{chunk}", body=data,
                 headers={"X-Stager-Crc32c": f"{crc32c(data):08x}"})
        assert r.status == 201, r.body
        sent[chunk] = data
    whole = payload(3 * MiB + 1)
    chunk = new_chunk(9)
    r = http(data_url, "PUT", f"/v1/chunks/{chunk}",
             body=iter([whole[:MiB], whole[MiB:]]),       # http.client: chunked encoding
             headers={"X-Stager-Crc32c": f"{crc32c(whole):08x}"})
    assert r.status == 201, r.body
    sent[chunk] = whole
    for chunk, data in sent.items():
        assert http(data_url, "GET", f"/v1/chunks/{chunk}").body == data


def test_a_body_cut_short_is_not_stored(http, data_url: str) -> None:
    chunk = new_chunk()
    data = b"x" * 1000
    host, port = data_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(f"PUT /v1/chunks/{chunk} HTTP/1.1\r\nHost: {host}\r\n"
                  f"X-Stager-Crc32c: {crc32c(data):08x}\r\nContent-Length: {len(data)}\r\n"
                  "\r\n".encode() + data[:100])
        s.shutdown(socket.SHUT_WR)              # the client goes away mid-body
        s.settimeout(10)
        while s.recv(65536):
            pass
    assert http(data_url, "GET", f"/v1/chunks/{chunk}").status == 404


async def test_batches_and_single_puts_share_buffers(data_url: str, cluster: ThreadCluster,
                                                     payload) -> None:
    target = cluster.target_id(0)
    options = PlaneOptions()
    async with make_session(options) as session:
        plane = DataPlane(session, options)
        items = [(new_chunk(i), payload(200_000 + i), 0) for i in range(5)]
        items = [(c, d, crc32c(d)) for c, d, _ in items]
        for _ in range(2):
            await plane.put_chunks(target, data_url, items)
            big = payload(2 * MiB + 5)
            one = new_chunk()
            await plane.put_chunk(target, data_url, one, big, crc32c(big))
            out = bytearray(len(big))
            assert await plane.read_chunk_into(target, data_url, one, 0, memoryview(out),
                                               whole=True) == crc32c(big)
            assert out == big
        for chunk, data, _ in items:
            got = bytearray(len(data))
            await plane.read_chunk_into(target, data_url, chunk, 0, memoryview(got))
            assert got == data


# -- writer: owned buffers --------------------------------------------------------------
async def test_write_owned_sends_from_the_buffer_then_releases_it(aclient: AsyncClient,
                                                                  ns: str, payload) -> None:
    data = payload(5 * MiB // 2)
    buf = bytearray(data)
    released = []
    file_id, writer = await aclient.create(f"{ns}/owned",
                                           layout=LayoutSpec(chunk_size=MiB))
    await writer.write_owned(memoryview(buf), lambda: released.append(True))
    info = await aclient.commit(file_id, writer)
    await asyncio.sleep(0)              # done callbacks run on the next loop pass
    assert released == [True]
    assert info.size == len(data) and await aclient.cat(f"{ns}/owned") == data


async def test_write_owned_releases_when_a_put_fails(aclient: AsyncClient, ns: str) -> None:
    released = []
    file_id, writer = await aclient.create(f"{ns}/fails", layout=LayoutSpec(chunk_size=MiB))
    writer.locations = {}                   # no target is known: every PUT fails
    with pytest.raises(TargetUnavailable):
        await writer.write_owned(memoryview(bytearray(3 * MiB)), lambda: released.append(1))
        await writer.close()
    await aclient.abort(file_id, writer)
    for _ in range(3):
        await asyncio.sleep(0)
    assert released == [1]


# -- copy_in: chunk-aligned parts, one pool ----------------------------------------------
class CountingBuffers(Buffers):
    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.seen: set[int] = set()

    async def get(self, size: int) -> bytearray:
        buf = await super().get(size)
        self.seen.add(id(buf))
        return buf


async def test_a_buffer_whose_read_was_cancelled_is_never_reused() -> None:
    """A cancelled read in a thread goes on writing into its buffer: the pool must not
    hand that buffer out again, but may make a new one in its place."""
    pool = Buffers(1)
    first = await pool.get(10)
    done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    done.set_result(10)
    pool.recycle(first, done)
    assert await pool.get(10) is first              # a finished read: reused
    cancelled: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    cancelled.cancel()
    pool.recycle(first, cancelled)
    second = await asyncio.wait_for(pool.get(10), 1)
    assert second is not first and len(second) == 10
    assert not pool.ready()


async def test_two_files_share_a_small_pool(aclient: AsyncClient, ns: str, tmp_path: Path,
                                            payload) -> None:
    """Parts are rounded to whole chunks (2.5 MiB -> 2 MiB); a pool too small for both
    files' windows slows them down but never stalls them."""
    files = {f"f{i}": payload(7 * MiB + 1000 * i) for i in range(2)}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    source = ThreadSource("file://", open_source(str(tmp_path)).fs, "/")
    pool = CountingBuffers(3)
    try:
        await asyncio.gather(*(
            copy_in(aclient, source, str(tmp_path / name), len(data), f"{ns}/{name}",
                    layout=LayoutSpec(chunk_size=MiB), part=5 * MiB // 2, window=2,
                    buffers=pool)
            for name, data in files.items()))
    finally:
        await source.close()
    assert len(pool.seen) <= 3
    for name, data in files.items():
        assert await aclient.cat(f"{ns}/{name}") == data


async def test_a_source_that_shrinks_is_never_staged(aclient: AsyncClient, ns: str,
                                                     tmp_path: Path, payload) -> None:
    (tmp_path / "f").write_bytes(payload(5 * MiB))
    source = ThreadSource("file://", open_source(str(tmp_path)).fs, "/")
    try:
        with pytest.raises(SourceError, match="changed while staging"):
            await copy_in(aclient, source, str(tmp_path / "f"), 9 * MiB, f"{ns}/f",
                          layout=LayoutSpec(chunk_size=MiB))
    finally:
        await source.close()
    assert not await aclient.exists(f"{ns}/f")


# -- the http source: raw ranged reads ---------------------------------------------------
@pytest.fixture
def served(tmp_path: Path, payload) -> Iterator[tuple[str, bytes]]:
    data = payload(3 * MiB + 17)
    (tmp_path / "a b.bin").write_bytes(data)
    with HttpServer(tmp_path) as server:
        yield server.url, data


async def test_raw_ranges_land_in_the_buffer(served: tuple[str, bytes]) -> None:
    url, data = served
    source = open_source(url + "/")
    try:
        assert isinstance(source, AsyncSource) and source._raw is not None
        out = bytearray(MiB)
        path = f"{url}/a%20b.bin"
        got = await source._raw.read_into(path, 5, memoryview(out))
        assert got is not None and got.total == len(data) and got.etag
        assert out == data[5:5 + MiB]
        tail = bytearray(MiB)       # past the end: the server answers fewer bytes
        assert await source.read_into(path, 3 * MiB, memoryview(tail)) == 17
        assert tail[:17] == data[3 * MiB:]
        assert await source._raw.read_into("https://127.0.0.1:1/x", 0,
                                           memoryview(out)) is None
    finally:
        await source.close()
    with_options = open_source(url + "/", headers={"X-Token": "t"})
    try:
        assert isinstance(with_options, AsyncSource) and with_options._raw is None
    finally:
        await with_options.close()


async def test_a_server_without_ranges_falls_back_to_fsspec(tmp_path: Path, payload) -> None:
    data = payload(2 * MiB + 3)
    (tmp_path / "f.bin").write_bytes(data)
    proc = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind",
                             "127.0.0.1", "--directory", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    try:
        port = re.search(r"port (\d+)", proc.stdout.readline())
        assert port is not None
        url = f"http://127.0.0.1:{port.group(1)}/f.bin"
        source = open_source(url)
        try:
            assert isinstance(source, AsyncSource)
            raw = source._raw
            assert isinstance(raw, RawHttp)
            out = bytearray(MiB)
            assert await raw.read_into(url, 0, memoryview(out)) is None   # a 200, not 206
            # through fsspec: the whole file, which tells the caller ranges are ignored
            assert await source.read_into(url, 0, memoryview(out)) == len(data)
            assert out == data[:MiB]
        finally:
            await source.close()
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
