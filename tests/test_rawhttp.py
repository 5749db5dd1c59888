"""The raw read path (stager.dataplane.rawhttp) against real servers that misbehave.

Each server here is real and listens on 127.0.0.1:0: an aiohttp application, or
a bare asyncio server for framing aiohttp would never produce.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from stager.dataplane import DataPlane, PlaneOptions, make_session
from stager.errors import ChunkNotFound, CorruptChunk, TargetUnavailable
from stager.web.middleware import error_response
from stager.web.server import start_sites, stop_sites

CHUNK = "0123456789abcdef0123456789abcdef.0"
DATA = bytes(range(256)) * 4096          # 1 MiB


async def _serve(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                 ) -> AsyncIterator[tuple[str, set[tuple[str, int]]]]:
    peers: set[tuple[str, int]] = set()

    async def wrapped(request: web.Request) -> web.StreamResponse:
        peers.add(request.transport.get_extra_info("peername"))  # type: ignore[union-attr]
        return await handler(request)

    app = web.Application()
    app.router.add_route("*", "/v1/chunks/{chunk}", wrapped)
    app.router.add_post("/v1/read", wrapped)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sockets = await start_sites(runner, "127.0.0.1", 0)
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", peers
    finally:
        await stop_sites(runner, sockets)


@pytest.fixture
async def plane() -> AsyncIterator[DataPlane]:
    options = PlaneOptions(request_timeout=0.5, connect_timeout=2.0)
    async with make_session(options) as session:
        yield DataPlane(session, options)


async def test_body_lands_in_the_buffer_over_one_reused_connection(plane: DataPlane) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=DATA, headers={"X-Stager-Crc32c": "0000abcd"})

    async for url, peers in _serve(handler):
        buf = bytearray(len(DATA))
        for _ in range(3):
            crc = await plane.read_chunk_into("t0", url, CHUNK, 0, memoryview(buf), whole=True)
            assert bytes(buf) == DATA and crc == 0xABCD
        assert len(peers) == 1                    # kept alive and reused
        buf.extend(b"x")                          # no reference to the buffer is kept
        counter = plane.counters["t0"]
        assert (counter.requests, counter.errors, counter.bytes_read) == (3, 0, 3 * len(DATA))


async def test_chunked_response_is_read_through_aiohttp(plane: DataPlane) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()            # no length: chunked transfer encoding
        await response.prepare(request)
        for i in range(0, len(DATA), 100_000):
            await response.write(DATA[i:i + 100_000])
        await response.write_eof()
        return response

    async for url, _ in _serve(handler):
        buf = bytearray(len(DATA))
        await plane.read_chunk_into("t0", url, CHUNK, 0, memoryview(buf))
        assert bytes(buf) == DATA and plane.counters["t0"].requests == 1


@pytest.mark.parametrize(("size", "error"), [(len(DATA) + 1, CorruptChunk),
                                             (len(DATA) - 1, TargetUnavailable)])
async def test_wrong_length_is_an_error_and_drops_the_connection(
        plane: DataPlane, size: int, error: type[Exception]) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=(DATA + b"!")[:size])

    async for url, peers in _serve(handler):
        buf = bytearray(len(DATA))
        for _ in range(2):
            with pytest.raises(error):
                await plane.read_chunk_into("t0", url, CHUNK, 0, memoryview(buf))
        assert len(peers) == 2 and plane.counters["t0"].errors == 2


async def test_error_body_becomes_the_stager_error(plane: DataPlane) -> None:
    async def handler(request: web.Request) -> web.Response:
        return error_response(ChunkNotFound(f"no chunk {CHUNK}", chunk=CHUNK))

    async for url, _ in _serve(handler):
        with pytest.raises(ChunkNotFound, match="no chunk"):
            await plane.read_chunk_into("t0", url, CHUNK, 0, memoryview(bytearray(10)))


async def test_batched_read_posts_its_items(plane: DataPlane) -> None:
    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        assert request.method == "POST" and body["items"][0][0] == CHUNK
        return web.Response(body=DATA[:1000])

    from stager.protocol.models import ReadItem

    async for url, _ in _serve(handler):
        buf = bytearray(1000)
        await plane.batch_read_into("t0", url, [ReadItem(CHUNK, 0, 1000)], memoryview(buf))
        assert bytes(buf) == DATA[:1000]


async def _bare_server(answer: Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                                        Awaitable[None]]) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


def _paced(body: bytes, lengths: tuple[int, ...], piece: int, pause: float, *,
           stop: int | None = None) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                                                 Awaitable[None]]:
    """A bare server answering one request per length with that much of ``body``,
    sent ``piece`` bytes at a time ``pause`` seconds apart (up to ``stop`` bytes,
    then silence until the client hangs up)."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for n in lengths:
                await _read_request(reader)
                writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n".encode())
                for at in range(0, n if stop is None else stop, piece):
                    writer.write(body[at:min(n, at + piece)])
                    await writer.drain()
                    await asyncio.sleep(pause)
            await reader.read()
        finally:
            writer.close()
    return answer


async def test_connection_closed_while_idle_is_retried_on_a_fresh_one(
        plane: DataPlane) -> None:
    connections = 0

    async def one_request_then_close(reader: asyncio.StreamReader,
                                     writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            await _read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
            await writer.drain()
        finally:
            writer.close()      # no "Connection: close": the client learns it later

    server, url = await _bare_server(one_request_then_close)
    async with server:
        buf = bytearray(5)
        await plane.read_chunk_into("t0", url, CHUNK, 0, memoryview(buf))
        await asyncio.sleep(0.05)
        await plane.read_chunk_into("t0", url, CHUNK, 0, memoryview(buf))
        assert bytes(buf) == b"hello" and connections == 2
        assert plane.counters["t0"].errors == 0


async def test_silent_server_times_out_as_unavailable(plane: DataPlane) -> None:
    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await _read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")   # then silence
            await writer.drain()
            await reader.read()         # until the client gives up and closes
        finally:
            writer.close()

    server, url = await _bare_server(never_answer)
    async with server:
        start = time.monotonic()
        with pytest.raises(TargetUnavailable, match="TimeoutError"):
            await plane.read_chunk_into("t0", url, CHUNK, 0, memoryview(bytearray(10)))
        assert time.monotonic() - start < 2.5
        assert plane.counters["t0"].failed_at > 0


async def test_raw_reads_can_be_turned_off() -> None:
    options = PlaneOptions(raw_reads=False)
    async with make_session(options) as session:
        plane = DataPlane(session, options)

        async def handler(request: web.Request) -> web.Response:
            return web.Response(body=DATA)

        async for url, _ in _serve(handler):
            buf = bytearray(len(DATA))
            await plane.read_chunk_into("t0", url, CHUNK, 0, memoryview(buf))
            assert bytes(buf) == DATA
    assert plane._raw_pool() is None


async def test_up_to_mode_takes_a_shorter_body_and_refuses_a_longer_one() -> None:
    """``exact=False`` (staging's probes): a body up to the buffer's size lands at its
    start over a connection kept for reuse, a 304 has none; a longer body is refused
    before it is read."""
    from stager.dataplane import rawhttp

    async def handler(request: web.Request) -> web.Response:
        if "If-None-Match" in request.headers:      # a 304 has no body, whatever it says
            return web.Response(status=304, headers={"ETag": '"e"'})
        return web.Response(body=DATA[:int(request.query["n"])])

    pool = rawhttp.RawPool(limit=4, connect_timeout=2.0, read_timeout=2.0)
    try:
        async for url, peers in _serve(handler):
            buf = bytearray(1000)
            for n in (10, 1000, 0):
                resp = await pool.request(url, "GET", f"/v1/chunks/{CHUNK}?n={n}", {}, None,
                                          memoryview(buf), exact=False)
                assert resp.status == 200 and resp.length == n and buf[:n] == DATA[:n]
            resp = await pool.request(url, "GET", f"/v1/chunks/{CHUNK}?n=5", {
                "If-None-Match": '"e"'}, None, memoryview(buf), exact=False)
            assert (resp.status, resp.length, resp.headers["etag"]) == (304, 0, '"e"')
            assert len(peers) == 1
            with pytest.raises(rawhttp.LengthMismatch):
                await pool.request(url, "GET", f"/v1/chunks/{CHUNK}?n=1001", {}, None,
                                   memoryview(buf), exact=False)
            with pytest.raises(rawhttp.LengthMismatch):      # the default: exactly
                await pool.request(url, "GET", f"/v1/chunks/{CHUNK}?n=10", {}, None,
                                   memoryview(buf))
    finally:
        pool.close()


async def test_a_connection_reset_before_the_request_is_a_reset_not_a_crash() -> None:
    """A server that resets every connection right after the handshake (as a data
    server killed at that moment does): each request fails as a connection reset,
    which readers fail over from, never with an internal error.  Some of these
    connections are already closed when the request is sent, the rest while it is
    under way."""
    import socket
    import struct

    from stager.dataplane.rawhttp import RawPool

    def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()          # SO_LINGER 0: an RST, not a FIN

    server = await asyncio.start_server(reset, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = RawPool(limit=4, connect_timeout=2.0, read_timeout=2.0)
    try:
        for _ in range(20):
            with pytest.raises(OSError):
                await pool.request(f"http://127.0.0.1:{port}", "GET", "/x", {}, None,
                                   memoryview(bytearray(10)))
            await asyncio.sleep(0.01)       # the reset may arrive before the next request
    finally:
        pool.close()
        server.close()
        await server.wait_closed()


async def test_starting_a_request_on_a_closed_connection_raises_a_reset() -> None:
    from stager.dataplane.rawhttp import _Conn

    conn = _Conn()
    conn.connection_made(None)      # type: ignore[arg-type]
    conn.connection_lost(None)      # the server went away before anything was sent
    with pytest.raises(ConnectionResetError):
        conn.start(b"GET / HTTP/1.1\r\n\r\n", memoryview(bytearray(1)))


async def test_a_long_body_wakes_the_loop_once_per_low_mark_and_the_mark_is_reset(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4 MiB body sent in 64 KiB pieces arrives in a few large reads
    (SO_RCVLOWAT), not one per piece; the next response on the same connection,
    a short one, still wakes the loop (the mark went back to 1)."""
    import socket

    from stager.dataplane import rawhttp

    body, piece = DATA * 4, 64 * 1024
    reads: list[int] = []
    received = rawhttp._Conn.buffer_updated

    def counting(self: rawhttp._Conn, nbytes: int) -> None:
        reads.append(nbytes)            # counted, then handled as ever
        received(self, nbytes)

    monkeypatch.setattr(rawhttp._Conn, "buffer_updated", counting)

    server, url = await _bare_server(_paced(body, (len(body), 10), piece, 0.001))
    pool = rawhttp.RawPool(limit=1, connect_timeout=2.0, read_timeout=2.0)
    try:
        async with server:
            buf = bytearray(len(body))
            await pool.request(url, "GET", f"/v1/chunks/{CHUNK}", {}, None, memoryview(buf))
            assert bytes(buf) == body
            # the head, then at least min(what is left, RCVLOWAT) bytes per read
            # (one read per 64 KiB piece would be 64)
            assert len(reads) <= 2 + len(body) // rawhttp.RCVLOWAT, reads
            conn = next(iter(pool._all))
            assert conn._sock is not None
            assert conn._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
            small = memoryview(bytearray(10))
            await asyncio.wait_for(pool.request(url, "GET", f"/v1/chunks/{CHUNK}", {}, None,
                                                small), 2.0)
            assert bytes(small) == body[:10] and len(pool._all) == 1
    finally:
        pool.close()


async def test_a_body_trickling_under_the_low_mark_is_not_taken_for_silence() -> None:
    """Bytes that wait in the kernel under the low mark count for the inactivity
    timer: a body arriving slower than the mark fills but faster than the timeout
    is read whole, where a server that falls silent is still given up."""
    from stager.dataplane import rawhttp

    size, piece = 512 * 1024, 16 * 1024
    pool = rawhttp.RawPool(limit=1, connect_timeout=2.0, read_timeout=0.2)
    try:
        # 16 KiB every 20 ms: about 0.65 s, never 0.2 s without a byte
        server, url = await _bare_server(_paced(DATA, (size,), piece, 0.02))
        async with server:
            buf = bytearray(size)
            await pool.request(url, "GET", f"/v1/chunks/{CHUNK}", {}, None, memoryview(buf))
            assert bytes(buf) == DATA[:size]
        # a quarter of the body, then silence
        server, url = await _bare_server(_paced(DATA, (size,), piece, 0.0, stop=size // 4))
        async with server:
            start = time.monotonic()
            with pytest.raises(TimeoutError):
                await pool.request(url, "GET", f"/v1/chunks/{CHUNK}", {}, None,
                                   memoryview(bytearray(size)))
            assert time.monotonic() - start < 1.5
    finally:
        pool.close()
