"""Chunk reads straight into the caller's buffer: a small HTTP/1.1 client for the hot path.

aiohttp hands a response body over as a fresh ``bytes`` object per socket read,
which the reader then copies into its buffer; at loopback rates that allocation,
the copy and the per-piece Python work were about half of the client's CPU
(profiled with py-spy; figures in bench/NOTES.md).  Here an
``asyncio.BufferedProtocol`` hands the kernel the destination itself
(``recv_into``), so a body is copied once: from the socket to its final place.

A long body is read in large pieces: ``SO_RCVLOWAT`` tells the kernel to wake
the loop only once up to ``RCVLOWAT`` bytes of it are in, where the loop would
otherwise take each 64-100 KiB that happens to be there (a whole 4 MiB chunk
went from about 32 reads to 4, and the client and the data server each spent a
quarter to a third less CPU on it: ``python -m bench.profile_small chunks``).

Over TLS (``https://`` targets, with the pool's ``ssl`` context) the same
protocol sits on asyncio's SSL transport, which decrypts each record straight
into the buffer ``get_buffer`` gives it: still no copy beyond the one
decryption makes.  The low mark works there too, a record short: the kernel
holds ciphertext, which is longer than the plaintext it carries, but up to one
record already read may sit undecrypted in the SSL layer (the transport decrypts
all it holds before it hands us bytes), so the mark is the plaintext still due
less ``TLS_SLACK``, and at most ``TLS_RCVLOWAT``: the most the transport takes
from the socket per read.  Each wake of the loop costs the TLS transport's
Python layers a pass: a 4 MiB body sent in 64 KiB pieces took 66 of them, now
18 (tests/test_rawhttp_tls.py).

Only the responses stager's data servers send are understood: a status line,
headers, and a body framed by ``Content-Length`` (or none: a 304).  Anything
else raises :class:`Unsupported` before a byte of the body is used, and the
caller repeats the request through aiohttp.  Connections are kept alive and reused, at most
``limit`` per target; a connection the server closed while idle is retried once
on a fresh one (only reads go this way, and they are idempotent).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import ssl
import struct
import termios
import weakref
from asyncio.trsock import TransportSocket
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..auth.tls import client_context

HEAD_BUF = 8192                 # the first recv of a response: status line and headers
MAX_HEAD = 64 * 1024
MAX_ERROR_BODY = 1 << 20
RCVLOWAT = 1 << 20              # a long body wakes the loop once per this many bytes
LOWAT_FROM = 128 * 1024         # ... when at least this much of it is still to come
TLS_RCVLOWAT = 256 * 1024       # over TLS: asyncio's SSL transport reads this much at most
TLS_SLACK = 64 * 1024           # ... and the mark leaves room for a record held undecrypted


class Unsupported(Exception):
    """A response this client does not frame (no Content-Length, chunked, not HTTP/1.x)."""


class LengthMismatch(Exception):
    """The response's body is not the size of the buffer it was asked into (or, with
    ``exact=False``, larger than it)."""

    def __init__(self, length: int, want: int) -> None:
        super().__init__(f"{length} bytes, {want} asked for")
        self.length, self.want = length, want


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]                     # lower-case names
    body: bytes = b""                           # error responses only; success fills ``dest``
    length: int = 0                             # the body's length (Content-Length)


class _Conn(asyncio.BufferedProtocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self, tls: bool = False) -> None:
        self.tls = tls                  # over TLS: a lower low mark (see the module's docstring)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = True
        self.progress = 0               # bytes received, for the inactivity timer
        self._scratch = bytearray(HEAD_BUF)
        self._head = bytearray()
        self._waiter: asyncio.Future[RawResponse] | None = None
        self._dest = memoryview(b"")
        self._exact = True                      # the body must fill ``_dest`` (else: up to)
        self._body: memoryview | None = None    # where the body goes, once the head is parsed
        self._pos = 0
        self._resp: RawResponse | None = None
        self._sock: socket.socket | TransportSocket | None = None   # for the low mark
        self._own: socket.socket | None = None   # ... a duplicate this connection closes
        self._lowat = 1                         # the socket's SO_RCVLOWAT

    # -- asyncio callbacks -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is None or isinstance(sock, TransportSocket):
            self._sock = sock           # asyncio's: a thin wrapper of the socket itself
            return
        # Elsewhere (uvloop) a socket object of our own, on a duplicate of the
        # descriptor: uvloop's stand-in builds a new socket object (three system
        # calls) for every setsockopt, and the low mark is set twice per response.
        try:
            own = socket.socket(sock.family, sock.type, sock.proto, os.dup(sock.fileno()))
        except OSError:
            return                      # no low mark: every read wakes the loop
        self._sock = self._own = own
        # closed with the connection, or when a connection never closed is dropped
        weakref.finalize(self, own.close)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._close_sock()
        self._fail(exc or ConnectionResetError("connection closed by the server"))

    def _close_sock(self) -> None:
        """Forget the connection's socket (closing the duplicate, if one was made)."""
        if self._own is not None:
            self._own.close()
            self._own = None
        self._sock = None

    def eof_received(self) -> bool:
        return False                    # close our side too

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is not None:
            return self._body[self._pos:]
        return memoryview(self._scratch)

    def buffer_updated(self, nbytes: int) -> None:
        self.progress += nbytes
        if self._waiter is None or self._waiter.done():
            self.abort(ConnectionError("data from the server while idle"))
        elif self._body is not None:
            self._pos += nbytes
            if self._pos == len(self._body):
                self._finish()
            else:
                self._wake_at(len(self._body) - self._pos)
        else:
            self._head += self._scratch[:nbytes]
            try:
                self._parse_head()
            except (Unsupported, LengthMismatch) as exc:
                self.abort(exc)
            except ValueError as exc:
                self.abort(Unsupported(f"unparsable response head: {exc}"))

    # -- one request -------------------------------------------------------------------
    def start(self, request: bytes, dest: memoryview,
              exact: bool = True) -> asyncio.Future[RawResponse]:
        if self.transport is None or self.closed:
            # The server closed it between connecting and now (a data server killed
            # right after the handshake): a reset like any other, so the caller
            # retries or fails over.
            raise ConnectionResetError("connection closed by the server before the request")
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        self._dest, self._body, self._pos, self._resp = dest, None, 0, None
        self._exact = exact
        self._head.clear()
        self._wake_at(0)
        self.transport.write(request)
        return self._waiter

    def _parse_head(self) -> None:
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > MAX_HEAD:
                raise Unsupported("response head too large")
            return
        lines = bytes(self._head[:end]).decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        if not version.startswith("HTTP/1."):
            raise Unsupported(f"not an HTTP/1.x response: {lines[0]!r}")
        status = int(rest.split(" ", 1)[0])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise Unsupported(f"bad header line {line!r}")
            headers[name.strip().lower()] = value.strip()
        if status == 304:
            length = 0          # never a body, whatever the headers say (RFC 9110 15.4.5)
        elif "transfer-encoding" in headers or "content-length" not in headers:
            raise Unsupported("the body is not framed by Content-Length")
        else:
            length = int(headers["content-length"])
        if headers.get("connection", "").lower() == "close" or version == "HTTP/1.0":
            self.reusable = False
        self._resp = RawResponse(status, headers, length=length)
        if status < 400:
            if length > len(self._dest) or (self._exact and length != len(self._dest)):
                raise LengthMismatch(length, len(self._dest))
            self._body = self._dest[:length]
        elif length <= MAX_ERROR_BODY:
            self._body = memoryview(bytearray(length))
        else:
            raise Unsupported("error body too large")
        extra = self._head[end + 4:]
        if len(extra) > length:
            raise Unsupported("more bytes than the response's length")
        self._body[:len(extra)] = extra
        self._pos = len(extra)
        if self._pos == length:
            self._finish()
        else:
            self._wake_at(length - self._pos)

    def _wake_at(self, left: int) -> None:
        """Have the loop woken once ``min(left, RCVLOWAT)`` more bytes are in (1: as
        soon as any are); ``left`` is what the body still lacks, so the mark never
        waits for bytes that will not come."""
        if self.tls:
            left -= TLS_SLACK
            want = min(left, TLS_RCVLOWAT) if left >= LOWAT_FROM else 1
        else:
            want = min(left, RCVLOWAT) if left >= LOWAT_FROM else 1
        if want == self._lowat or self._sock is None:
            return
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
        except OSError:
            self._close_sock()          # not on this socket: every read wakes the loop
            return
        self._lowat = want

    def received(self) -> int:
        """Bytes received so far: handed to this protocol, or waiting in the kernel
        under the low mark (for the inactivity timer)."""
        if self._lowat == 1 or self._sock is None:
            return self.progress
        try:
            queued = fcntl.ioctl(self._sock.fileno(), termios.FIONREAD, b"\0" * 4)
        except OSError:
            return self.progress
        return self.progress + struct.unpack("i", queued)[0]

    def _finish(self) -> None:
        assert self._resp is not None and self._waiter is not None
        self._wake_at(0)                # the next response's head must wake the loop
        if self._resp.status >= 400 and self._body is not None:
            self._resp.body = bytes(self._body)
        self._release()
        self._waiter.set_result(self._resp)

    def _release(self) -> None:
        # Drop every reference to the caller's buffer, so that it can be resized
        # or freed while this connection waits in the pool.
        self._body = None
        self._dest = memoryview(b"")

    def _fail(self, exc: BaseException) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        self._release()

    def abort(self, exc: BaseException) -> None:
        self.reusable = False
        self._fail(exc)
        self.close()

    def close(self) -> None:
        self.reusable = False
        self._close_sock()
        if self.transport is not None and not self.closed:
            self.closed = True
            if self.tls:
                # No close_notify exchange: it would wait on the server, and a pool
                # closed just before its loop ends would leave the socket open.
                self.transport.abort()
            else:
                self.transport.close()


@dataclass
class _Target:
    limit: asyncio.Semaphore
    idle: list[_Conn] = field(default_factory=list)


class RawPool:
    """Keep-alive connections to data servers, ``limit`` per target."""

    def __init__(self, *, limit: int, connect_timeout: float, read_timeout: float,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        """``ssl_context``: how ``https://`` targets are verified (default: the
        system's store, loaded on the first one)."""
        self.limit = limit
        self.ssl_context = ssl_context
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._targets: dict[tuple[str, int], _Target] = {}
        self._all: weakref.WeakSet[_Conn] = weakref.WeakSet()   # open ones stay referenced
        self.closed = False

    async def request(self, url: str, method: str, path: str, headers: Mapping[str, str],
                      body: bytes | None, dest: memoryview, *,
                      timeout: float | None = None, exact: bool = True) -> RawResponse:
        """Send one request; a success's body lands in ``dest``, which it must fill
        exactly (else :class:`LengthMismatch`), or with ``exact=False`` its first
        ``RawResponse.length`` bytes (a longer body: :class:`LengthMismatch`, before
        any of it is read).  ``timeout`` (default: the pool's ``read_timeout``)
        bounds the connect and every silence of the server."""
        if self.closed:
            raise ConnectionError("the connection pool is closed")
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        if parts.scheme != "http" and not tls:
            raise Unsupported(f"{parts.scheme}: not read this way")
        host, port = parts.hostname or "127.0.0.1", parts.port or (443 if tls else 80)
        target = self._targets.get((host, port))
        if target is None:
            target = self._targets[(host, port)] = _Target(asyncio.Semaphore(self.limit))
        request = _request_bytes(method, f"{parts.path.rstrip('/')}{path}", parts.netloc,
                                 headers, body)
        async with target.limit:
            for attempt in (0, 1):
                conn, reused = await self._conn(target, host, port, timeout, tls)
                try:
                    resp = await self._exchange(conn, request, dest, timeout, exact)
                except ConnectionResetError:
                    conn.close()
                    if reused and attempt == 0 and conn.progress == 0:
                        continue    # the server closed it while idle: once more, fresh
                    raise
                except BaseException:
                    conn.close()    # cancelled or failed mid-response: never reuse it
                    raise
                if conn.reusable and not conn.closed and not self.closed:
                    target.idle.append(conn)
                else:
                    conn.close()
                return resp
        raise AssertionError("unreachable")

    async def _conn(self, target: _Target, host: str, port: int,
                    timeout: float | None = None, tls: bool = False) -> tuple[_Conn, bool]:
        while target.idle:
            conn = target.idle.pop()
            if not conn.closed:
                conn.progress = 0
                return conn, True
        loop = asyncio.get_running_loop()
        limit = min(self.connect_timeout, timeout) if timeout else self.connect_timeout
        if tls:
            if self.ssl_context is None:
                self.ssl_context = client_context()
            made = loop.create_connection(lambda: _Conn(tls=True), host, port,
                                          ssl=self.ssl_context, server_hostname=host,
                                          ssl_handshake_timeout=limit)
        else:
            made = loop.create_connection(_Conn, host, port)
        _, conn = await asyncio.wait_for(made, limit)
        self._all.add(conn)
        return conn, False

    async def _exchange(self, conn: _Conn, request: bytes, dest: memoryview,
                        timeout: float | None = None, exact: bool = True) -> RawResponse:
        """Wait for the response, failing after ``timeout`` seconds without a byte."""
        limit = timeout or self.read_timeout
        waiter = conn.start(request, dest, exact)
        loop = asyncio.get_running_loop()
        seen, seen_at = 0, loop.time()

        # Looked at four times per limit, so a silent server is given up between
        # limit and 1.25 × limit after its last byte (failover stays bounded).
        def check() -> None:
            nonlocal seen, seen_at, timer
            if waiter.done():
                return
            now = loop.time()
            got = conn.received()
            if got != seen:
                seen, seen_at = got, now
            elif now - seen_at >= limit:
                conn.abort(TimeoutError(f"no data for {limit} s"))
                return
            timer = loop.call_later(limit / 4, check)

        timer = loop.call_later(limit / 4, check)
        try:
            return await waiter
        finally:
            timer.cancel()

    def close(self) -> None:
        """Close every connection (idle or not); later requests fail."""
        self.closed = True
        for conn in list(self._all):
            try:
                conn.close()
            except RuntimeError:
                pass            # its loop is already closed: nothing left to close on
        self._all.clear()
        self._targets.clear()


def _request_bytes(method: str, path: str, host: str, headers: Mapping[str, str],
                   body: bytes | None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if body else head
