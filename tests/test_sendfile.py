"""Whole-chunk GETs sent with ``sendfile`` (stager/web/sendfile.py): a chunk larger than
the socket's send buffer to a slow reader, an empty one, several on one connection."""

from __future__ import annotations

import socket
import time
import uuid
from urllib.parse import urlsplit

import pytest

from stager.checksum import crc32c
from stager.testing import ThreadCluster

MiB = 1 << 20


@pytest.fixture
def data_url(cluster: ThreadCluster) -> str:
    server = cluster.data[0]
    assert server is not None
    return server.url


def _put(http, url: str, data: bytes) -> str:  # type: ignore[no-untyped-def]
    chunk = f"{uuid.uuid4().hex}.0"
    r = http(url, "PUT", f"/v1/chunks/{chunk}", body=data,
             headers={"X-Stager-Crc32c": f"{crc32c(data):08x}"})
    assert r.status == 201, r.body
    return chunk


def _slow_get(url: str, chunk: str, pause: float) -> tuple[bytes, bytes]:
    """GET the chunk over a socket with a small receive buffer, pausing before the
    body is read: the server's first ``sendfile`` cannot take it all."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.sendall(f"GET /v1/chunks/{chunk} HTTP/1.1\r\nHost: x\r\n"
                     "Connection: close\r\n\r\n".encode())
        time.sleep(pause)
        got = bytearray()
        while data := sock.recv(1 << 20):
            got += data
    head, _, body = bytes(got).partition(b"\r\n\r\n")
    return head, body


def test_a_chunk_larger_than_the_send_buffer_arrives_whole(http, data_url: str,
                                                          payload) -> None:
    # 12 MiB: more than Linux's largest autotuned send buffer (4 MiB), so the server
    # waits for the client to drain it, several times.
    data = payload(12 * MiB + 5)
    chunk = _put(http, data_url, data)
    head, body = _slow_get(data_url, chunk, 0.3)
    assert head.startswith(b"HTTP/1.1 200")
    assert f"Content-Length: {len(data)}".encode() in head
    assert len(body) == len(data) and body == data


def test_an_empty_chunk_is_an_empty_body(http, data_url: str) -> None:
    chunk = _put(http, data_url, b"")
    r = http(data_url, "GET", f"/v1/chunks/{chunk}")
    assert r.status == 200 and r.body == b""
    assert r.headers["Content-Length"] == "0"
    # and the connection still serves the next request
    head, body = _slow_get(data_url, chunk, 0)
    assert head.startswith(b"HTTP/1.1 200") and body == b""


def test_keep_alive_gets_in_a_row(http, data_url: str, payload) -> None:
    """Several whole chunks on one connection: each body follows its own head."""
    chunks = [(c, d) for d in (payload(MiB + 1), payload(3 * MiB), payload(17))
              for c in [_put(http, data_url, d)]]
    parts = urlsplit(data_url)
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        reader = sock.makefile("rb")
        for chunk, data in chunks:
            sock.sendall(f"GET /v1/chunks/{chunk} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            status = reader.readline()
            assert status.startswith(b"HTTP/1.1 200"), status
            length = -1
            while (line := reader.readline()) != b"\r\n":
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            assert length == len(data)
            assert reader.read(length) == data
