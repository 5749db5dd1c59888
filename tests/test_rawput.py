"""Small chunk PUTs through the raw client (stager.dataplane.rawput) against a real data
server on 127.0.0.1:0: stored and proved over plain HTTP and TLS, resent on a fresh
connection when the kept-alive one is gone, refused as aiohttp's path refuses them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from stager.auth.tls import ensure_cluster_tls, server_context
from stager.checksum import crc32c
from stager.config import load_config
from stager.data.app import make_data_app
from stager.dataplane import DataPlane, PlaneOptions, make_session
from stager.dataplane.rawput import put_chunk
from stager.errors import StagerError
from stager.web.server import start_sites, stop_sites

FILE = "0123456789abcdef0123456789abcdef"
DATA = os.urandom(1024)
LIMIT = 4096            # the data server's max_chunk_size here


@dataclass
class DataServer:
    url: str
    seen: list[tuple[str, str]] = field(default_factory=list)   # (method, User-Agent)


@contextlib.asynccontextmanager
async def data_server(root: Path, tls: bool = False) -> AsyncIterator[DataServer]:
    """A real data server (not registered: auth off, it takes chunks as they come)."""
    config = load_config({"root": str(root / "data"), "max_chunk_size": LIMIT}, env={})
    app = make_data_app(config)
    server = DataServer("")

    async def note(request: web.Request, response: web.StreamResponse) -> None:
        server.seen.append((request.method, request.headers.get("User-Agent", "")))

    app.on_response_prepare.append(note)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    files = ensure_cluster_tls(root / "tls") if tls else None
    sockets = await start_sites(runner, "127.0.0.1", 0, ssl_context=server_context(
        files.cert, files.key) if files else None)
    server.url = f"{'https' if tls else 'http'}://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield server
    finally:
        await stop_sites(runner, sockets)


@contextlib.asynccontextmanager
async def plane_for(root: Path, tls: bool = False) -> AsyncIterator[DataPlane]:
    ca = str(ensure_cluster_tls(root / "tls").ca_cert) if tls else ""
    options = PlaneOptions(connect_timeout=2.0, request_timeout=5.0, write_timeout=5.0,
                           ca_file=ca)
    async with make_session(options) as session:
        yield DataPlane(session, options)


async def _read(plane: DataPlane, url: str, chunk: str, size: int) -> bytes:
    out = bytearray(size)
    await plane.read_chunk_into("t0", url, chunk, 0, memoryview(out), whole=True)
    return bytes(out)


@pytest.mark.parametrize("tls", [False, True])
async def test_a_small_put_goes_raw_over_one_kept_alive_connection(tmp_path: Path,
                                                                   tls: bool) -> None:
    async with data_server(tmp_path, tls) as server, plane_for(tmp_path, tls) as plane:
        for i in range(3):
            await put_chunk(plane, "t0", server.url, f"{FILE}.{i}", DATA, crc32c(DATA))
        puts = [agent for method, agent in server.seen if method == "PUT"]
        assert puts == ["", "", ""]             # no aiohttp client: the raw one
        for i in range(3):
            assert await _read(plane, server.url, f"{FILE}.{i}", len(DATA)) == DATA
        counter = plane.counters["t0"]
        assert (counter.errors, counter.bytes_written) == (0, 3 * len(DATA))


async def test_a_put_on_a_connection_the_server_dropped_is_sent_again_fresh(
        tmp_path: Path) -> None:
    """A proxy in front of the data server forwards the first request of a connection and
    drops the connection at the second, unanswered (the server closed it while idle): the
    PUT goes again on a new connection and is stored once."""
    async with data_server(tmp_path) as server, plane_for(tmp_path) as plane:
        host, port = server.url.removeprefix("http://").split(":")
        connections = 0

        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            up_r, up_w = await asyncio.open_connection(host, int(port))
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            up_w.write(head + await reader.readexactly(length))
            answer = await up_r.readuntil(b"\r\n\r\n")
            size = int(next(line.split(b":")[1] for line in answer.split(b"\r\n")
                            if line.lower().startswith(b"content-length")))
            writer.write(answer + await up_r.readexactly(size))
            up_w.close()
            await reader.read(1)        # the next request: dropped unanswered
            writer.transport.abort()

        proxy = await asyncio.start_server(relay, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{proxy.sockets[0].getsockname()[1]}"
        try:
            await put_chunk(plane, "t0", url, f"{FILE}.0", DATA, crc32c(DATA))
            await put_chunk(plane, "t0", url, f"{FILE}.1", DATA[::-1], crc32c(DATA[::-1]))
        finally:
            proxy.close()
        assert connections == 2
        assert [m for m, agent in server.seen if m == "PUT" and not agent] == ["PUT", "PUT"]
        assert await _read(plane, server.url, f"{FILE}.1", len(DATA)) == DATA[::-1]


@pytest.mark.parametrize("chunk, data, crc", [
    ("not-a-chunk-id", DATA, None),                 # 400 bad_request
    (f"{FILE}.0", os.urandom(LIMIT + 1), None),     # 413 payload_too_large
    (f"{FILE}.0", DATA, zlib.crc32(b"other")),      # the body is not what the CRC32C says
], ids=["bad-chunk-id", "too-large", "bad-crc"])    # the same ids in every xdist worker
async def test_a_refused_put_raises_what_aiohttps_path_raised(
        tmp_path: Path, chunk: str, data: bytes, crc: int | None) -> None:
    crc = crc32c(data) if crc is None else crc
    async with data_server(tmp_path) as server, plane_for(tmp_path) as plane:
        errors: list[StagerError] = []
        for limit in (1 << 20, 0):        # raw, then aiohttp's path (nothing goes raw)
            with pytest.raises(StagerError) as got:
                await put_chunk(plane, "t0", server.url, chunk, data, crc, limit=limit)
            errors.append(got.value)
        raw, plain = errors
        assert (type(raw), raw.status, raw.code, raw.message) == \
            (type(plain), plain.status, plain.code, plain.message)
        assert 400 <= raw.status < 500
        assert [agent == "" for m, agent in server.seen if m == "PUT"] == [True, False]
        assert plane.counters["t0"].errors == 2
