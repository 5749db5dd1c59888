"""Requests that are not valid HTTP/1.1 never reach the gateway's handlers: aiohttp's
parser answers them 400 in plain text and closes the connection (docs/s3.md, Errors).
Pinned here so that a change of aiohttp's answer (or a handler of ours taking them
over) is seen; the gateway serves the next request as before."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from conftest import raw_http

from stager.testing.cluster import ThreadCluster
from stager.testing.s3cluster import S3Thread

MALFORMED = {
    "request line": b"GET\r\n\r\n",
    "header without colon": b"GET /b/k HTTP/1.1\r\nHost: x\r\nbroken\r\n\r\n",
    "bad Content-Length": b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n",
    "two Content-Lengths": b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
                           b"Content-Length: 2\r\n\r\nab",
    "chunked body": b"PUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"zz\r\n",
    "long header": b"GET /b/k HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * 9000 + b"\r\n\r\n",
    "method": b"G@T /b/k HTTP/1.1\r\nHost: x\r\n\r\n",
}


@pytest.fixture(scope="module")
def gw(cluster: ThreadCluster) -> Iterator[S3Thread]:
    with S3Thread(cluster.meta_url) as s3:
        yield s3


def _send(url: str, raw: bytes) -> bytes:
    host, port = url.rsplit("//", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(raw)
        got = b""
        while chunk := s.recv(65536):       # b"": the server closed the connection
            got += chunk
    return got


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_http_is_a_plain_400_and_the_gateway_goes_on(gw: S3Thread,
                                                               name: str) -> None:
    head, _, body = _send(gw.url, MALFORMED[name]).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].split()[1] == "400", lines[0]
    assert any(h.lower().startswith("content-type: text/plain") for h in lines), lines
    assert b"Traceback" not in body
    assert raw_http(gw.url, "GET", "/").status == 200       # ListBuckets: still serving
