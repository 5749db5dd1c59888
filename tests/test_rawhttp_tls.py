"""The raw read client over TLS: the low mark on ciphertext, and its descriptor of its own."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import ssl
from pathlib import Path

import pytest
import uvloop  # a dependency of stager on Linux: this test never skips

from stager.auth.tls import client_context, ensure_cluster_tls, server_context
from stager.dataplane import rawhttp

DATA = os.urandom(4 << 20)
CHUNK = "0123456789abcdef0123456789abcdef.0"


async def _tls_server(tmp_path: Path, body: bytes, lengths: tuple[int, ...], piece: int,
                      pause: float) -> tuple[asyncio.Server, str, ssl.SSLContext]:
    """A bare HTTPS server answering one request per length with that much of ``body``,
    written ``piece`` bytes at a time ``pause`` seconds apart."""
    files = ensure_cluster_tls(tmp_path / "tls")

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for n in lengths:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n".encode())
                for at in range(0, n, piece):
                    writer.write(body[at:min(n, at + piece)])
                    await writer.drain()
                    await asyncio.sleep(pause)
            await reader.read()
        except (ConnectionError, ssl.SSLError):
            pass                        # the client aborts its TLS connections on close
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0,
                                        ssl=server_context(files.cert, files.key))
    port = server.sockets[0].getsockname()[1]
    return server, f"https://127.0.0.1:{port}", client_context(files.ca_cert)


async def test_a_long_tls_body_wakes_the_loop_once_per_low_mark_and_the_mark_is_reset(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4 MiB body written in 64 KiB pieces arrives over TLS in a few large reads
    (SO_RCVLOWAT on the ciphertext), not one per piece (64: the mark off, as before);
    the next response on the connection, a short one, still wakes the loop."""
    reads: list[int] = []
    received = rawhttp._Conn.buffer_updated

    def counting(self: rawhttp._Conn, nbytes: int) -> None:
        reads.append(nbytes)
        received(self, nbytes)

    monkeypatch.setattr(rawhttp._Conn, "buffer_updated", counting)
    server, url, ctx = await _tls_server(tmp_path, DATA, (len(DATA), 10), 64 * 1024, 0.001)
    pool = rawhttp.RawPool(limit=1, connect_timeout=5.0, read_timeout=5.0, ssl_context=ctx)
    try:
        async with server:
            buf = bytearray(len(DATA))
            await pool.request(url, "GET", f"/v1/chunks/{CHUNK}", {}, None, memoryview(buf))
            assert bytes(buf) == DATA
            # the head, then about TLS_RCVLOWAT bytes per read until the slack is left
            most = 4 + (len(DATA) // rawhttp.TLS_RCVLOWAT) * 2
            assert len(reads) <= most, (len(reads), reads)
            conn = next(iter(pool._all))
            assert conn._sock is not None
            assert conn._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
            small = memoryview(bytearray(10))
            await asyncio.wait_for(pool.request(url, "GET", f"/v1/chunks/{CHUNK}", {}, None,
                                                small), 5.0)
            assert bytes(small) == DATA[:10] and len(pool._all) == 1
    finally:
        pool.close()


@pytest.mark.parametrize("size", [rawhttp.LOWAT_FROM + rawhttp.TLS_SLACK + 1,
                                  rawhttp.TLS_SLACK + rawhttp.TLS_RCVLOWAT + 16 * 1024 + 7])
async def test_the_tls_low_mark_never_waits_for_bytes_that_do_not_come(
        tmp_path: Path, size: int) -> None:
    """Bodies just over where the mark starts, written a record at a time with pauses:
    the last ones never sit under a mark the rest of the body cannot reach (the
    inactivity timer would fail the read after 1 s)."""
    server, url, ctx = await _tls_server(tmp_path, DATA, (size, size), 16 * 1024, 0.002)
    pool = rawhttp.RawPool(limit=1, connect_timeout=5.0, read_timeout=1.0, ssl_context=ctx)
    try:
        async with server:
            for _ in range(2):
                buf = bytearray(size)
                await pool.request(url, "GET", f"/v1/chunks/{CHUNK}", {}, None,
                                   memoryview(buf))
                assert bytes(buf) == DATA[:size]
    finally:
        pool.close()


async def test_the_low_mark_uses_asyncios_socket_and_no_other_descriptor(
        tmp_path: Path) -> None:
    """On the stock loop the mark is set through the transport's own socket wrapper
    (cheap): no duplicate descriptor is made, and none is left behind."""
    server, url, ctx = await _tls_server(tmp_path, DATA, (10,), 16 * 1024, 0)
    pool = rawhttp.RawPool(limit=1, connect_timeout=5.0, read_timeout=5.0, ssl_context=ctx)
    async with server:
        await pool.request(url, "GET", f"/v1/chunks/{CHUNK}", {}, None,
                           memoryview(bytearray(10)))
        conn = next(iter(pool._all))
        assert conn._sock is conn.transport.get_extra_info("socket")  # type: ignore[union-attr]
        assert conn._own is None
        pool.close()
        assert conn._sock is None


def test_on_uvloop_the_mark_is_set_on_a_duplicate_closed_with_the_connection() -> None:
    """uvloop's socket stand-in builds a socket object per setsockopt; the connection
    sets the mark on a duplicate descriptor of its own instead, which the pool's
    close closes (and a connection dropped unclosed closes when collected)."""
    async def main() -> None:
        body = DATA[:1 << 20]

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode())
            for at in range(0, len(body), 64 * 1024):
                writer.write(body[at:at + 64 * 1024])
                await writer.drain()
            await reader.read()
            writer.close()
            await writer.wait_closed()
            served.set()

        served = asyncio.Event()
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        pool = rawhttp.RawPool(limit=1, connect_timeout=5.0, read_timeout=5.0)
        async with server:
            buf = bytearray(len(body))
            await pool.request(url, "GET", f"/v1/chunks/{CHUNK}", {}, None, memoryview(buf))
            assert bytes(buf) == body
            conn = next(iter(pool._all))
            own = conn._own
            assert own is not None and conn._sock is own
            assert own.fileno() != conn.transport.get_extra_info("socket").fileno()  # type: ignore[union-attr]
            assert own.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
            fd = own.fileno()
            pool.close()
            assert conn._own is None and own.fileno() == -1
            with pytest.raises(OSError):
                os.fstat(fd)
            await asyncio.wait_for(served.wait(), 5.0)    # the server saw the close
        await asyncio.sleep(0.05)                           # ... and its transports closed

    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()

    plain = socket.socket()
    try:
        class Transport:
            def get_extra_info(self, name: str) -> socket.socket:
                return plain

        dropped = rawhttp._Conn()
        dropped.connection_made(Transport())    # type: ignore[arg-type]
        assert dropped._own is not None
        fd = dropped._own.fileno()
        del dropped
        gc.collect()
        with pytest.raises(OSError):
            os.fstat(fd)
    finally:
        plain.close()
