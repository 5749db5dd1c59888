"""Raw S3 requests for tests that must control every byte (``test_s3_fuzz``).

:func:`request` writes one HTTP/1.1 request as bytes; :func:`raw` sends them on a
socket of its own (pausing, or half-closing, as asked) and reads the answer;
:func:`refused` holds the checks every S3 error answer must pass.  The helpers that
name keys (:func:`put`, :func:`holds`, …) name them in :data:`BUCKET`, which the
module using them makes.
"""

from __future__ import annotations

import base64
import re
import socket
import time
import xml.etree.ElementTree as ET
import zlib
from dataclasses import dataclass
from http.client import HTTPResponse
from urllib.parse import quote

from stager.testing.s3cluster import S3Cluster

BUCKET = "fuzz"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]         # lower-case names
    body: bytes


def raw(s3: S3Cluster, data: bytes, *, method: str = "GET", pause_at: int = 0,
        half_close: bool = False, hang_up: bool = False) -> Reply | None:
    """Write ``data`` (pausing after ``pause_at`` bytes, if given), read the answer;
    ``None`` when the gateway closed without one, or with ``hang_up`` (closed at once
    by this side, mid-request)."""
    host, port = s3.host_port.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        if pause_at:
            sock.sendall(data[:pause_at])
            time.sleep(0.3)
            data = data[pause_at:]
        try:
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass        # refused before the body was all sent: the answer is there
        if hang_up:
            return None
        response = HTTPResponse(sock, method=method)
        try:
            response.begin()
        except (ConnectionError, OSError) as exc:
            if "Remote end closed" in str(exc) or isinstance(exc, ConnectionResetError):
                return None
            raise
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()},
                     response.read())


def request(method: str, path: str, body: bytes = b"",
            headers: dict[str, str | bytes] | None = None) -> bytes:
    """The bytes of one request; ``Content-Length`` is the body's unless given
    (``None``: sent without one)."""
    head = {"Host": "s3.test", "Connection": "close", "Content-Length": str(len(body)),
            **(headers or {})}
    lines = [f"{method} {path} HTTP/1.1".encode()]
    for name, value in head.items():
        if value is not None:
            lines.append(name.encode() + b": " + (value if isinstance(value, bytes)
                                                  else value.encode("latin-1")))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def send(s3: S3Cluster, method: str, path: str, body: bytes = b"",
         headers: dict[str, str | bytes] | None = None, **kw: object) -> Reply:
    reply = raw(s3, request(method, path, body, headers), method=method, **kw)  # type: ignore[arg-type]
    assert reply is not None, f"{method} {path}: the gateway closed without an answer"
    return reply


def refused(reply: Reply, *codes: str, method: str = "GET") -> str:
    """The S3 error code of ``reply``, after every check an error answer must pass
    (and, given ``codes``, that it is one of them)."""
    assert 400 <= reply.status < 500 or reply.status == 501, (reply.status, reply.body)
    assert reply.headers.get("x-amz-request-id"), reply.headers
    assert b"Traceback" not in reply.body
    if method == "HEAD":
        assert reply.body == b""
        return ""
    root = ET.fromstring(reply.body)
    assert root.tag == "Error" and root.findtext("RequestId") == \
        reply.headers["x-amz-request-id"]
    code = str(root.findtext("Code"))
    assert not codes or code in codes, (code, root.findtext("Message"))
    return code


def readable(reply: Reply) -> None:
    """A success that is XML is XML any parser reads."""
    assert reply.status < 300, (reply.status, reply.body)
    if reply.headers.get("content-type") == "application/xml" and reply.body:
        ET.fromstring(reply.body)




def crc32(data: bytes) -> str:
    """A CRC32 as ``x-amz-checksum-crc32`` carries it."""
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def chunked_headers(decoded: str, **more: str) -> dict[str, str | bytes]:
    """The headers of an unsigned ``aws-chunked`` body whose data is ``decoded`` bytes
    long (``""``: no ``x-amz-decoded-content-length``)."""
    headers: dict[str, str | bytes] = {
        "Content-Encoding": "aws-chunked",
        "x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER", **more}
    if decoded:
        headers["x-amz-decoded-content-length"] = decoded.encode()
    return headers


def holds(s3: S3Cluster, key: str, data: bytes | None) -> None:
    """``key`` holds exactly ``data``; ``None``: it is absent, to HEAD and a listing."""
    got = send(s3, "GET", f"/{BUCKET}/{key}")
    if data is None:
        assert send(s3, "HEAD", f"/{BUCKET}/{key}").status == 404
        listing = send(s3, "GET", f"/{BUCKET}?list-type=2&prefix={quote(key)}")
        assert listing.status == 200 and b"<Key>" not in listing.body
        assert got.status == 404
    else:
        assert (got.status, got.body) == (200, data)


def put(s3: S3Cluster, key: str, data: bytes) -> None:
    assert send(s3, "PUT", f"/{BUCKET}/{key}", data).status == 200


def create_upload(s3: S3Cluster, key: str) -> str:
    reply = send(s3, "POST", f"/{BUCKET}/{key}?uploads")
    found = re.search(rb"<UploadId>([^<]+)</UploadId>", reply.body)
    assert reply.status == 200 and found, reply.body
    return found.group(1).decode()


def listed(s3: S3Cluster) -> bytes:
    reply = send(s3, "GET", f"/{BUCKET}?list-type=2")
    readable(reply)
    return reply.body
