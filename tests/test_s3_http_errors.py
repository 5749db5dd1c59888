"""Requests that are not valid HTTP/1.1 never reach a handler: aiohttp's parser refuses
them.  Every server answers them in its own error format all the same (stager/web/
parseerrors.py): the S3 gateway with S3's XML error and a request id, the metadata and
data servers with stager's JSON error; then it closes the connection and serves the
next request as before.  Real servers (``stager up --s3-port 0``), raw sockets."""

from __future__ import annotations

import json
import socket
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import pytest
from conftest import raw_http

from stager.testing.s3cluster import S3Cluster
from stager.web.server import MAX_HEADER_FIELD

# just over the servers' header limit (raised for capabilities): the parser refuses it
# on the request's last bytes, so none is left unread for the close to answer with RST
HUGE = b"a" * (MAX_HEADER_FIELD + 1)
# name -> (the request, S3's code for it)
MALFORMED = {
    "request line": (b"GET\r\n\r\n", "InvalidRequest"),
    "header without colon": (b"GET /b/k HTTP/1.1\r\nHost: x\r\nbroken\r\n\r\n",
                             "InvalidRequest"),
    "bad Content-Length": (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n",
                           "InvalidRequest"),
    "two Content-Lengths": (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
                            b"Content-Length: 2\r\n\r\nab", "InvalidRequest"),
    "chunked size": (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"zz\r\n", "InvalidRequest"),
    "chunked framing mid-body": (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
                                 b"chunked\r\n\r\n3\r\nabc\r\nzz\r\n", "InvalidRequest"),
    "body longer than Content-Length": (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: "
                                        b"0\r\n\r\nG@RBAGE\r\n\r\n", "InvalidRequest"),
    "long header": (b"GET /b/k HTTP/1.1\r\nHost: x\r\nX-A: " + HUGE + b"\r\n\r\n",
                    "RequestHeaderSectionTooLarge"),
    "method": (b"G@T /b/k HTTP/1.1\r\nHost: x\r\n\r\n", "InvalidRequest"),
}


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Cluster]:
    with S3Cluster(tmp_path_factory.mktemp("s3errors")) as c:
        yield c


def _send(url: str, raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Every answer to ``raw``, read until the server closes the connection."""
    host, port = url.rsplit("//", 1)[1].split(":")
    got = b""
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(raw)
        while chunk := s.recv(65536):       # b"": the server closed the connection
            got += chunk
    answers = []
    while got:
        head, _, rest = got.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
        size = int(headers.get("content-length", len(rest)))
        answers.append((int(lines[0].split()[1]), headers, rest[:size]))
        got = rest[size:]
    return answers


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_http_is_s3s_xml_error_and_the_gateway_goes_on(s3: S3Cluster,
                                                                 name: str) -> None:
    raw, code = MALFORMED[name]
    status, headers, body = _send(s3.url, raw)[-1]
    assert status == 400
    assert headers["content-type"] == "application/xml"
    root = ET.fromstring(body)
    assert root.tag == "Error" and root.findtext("Code") == code, body
    assert root.findtext("RequestId") == headers["x-amz-request-id"] != ""
    assert "malformed HTTP request" in (root.findtext("Message") or "")
    assert raw_http(s3.url, "GET", "/").status == 200       # ListBuckets: still serving


@pytest.mark.parametrize("server", ["meta", "data"])
@pytest.mark.parametrize("name", ["request line", "chunked size", "long header"])
def test_the_json_servers_answer_malformed_http_with_their_json_error(
        s3: S3Cluster, server: str, name: str) -> None:
    info = s3.cluster.info
    url = info["meta"] if server == "meta" else info["data"][0]["url"]
    url = url["url"] if isinstance(url, dict) else url
    status, headers, body = _send(url, MALFORMED[name][0].replace(b"/b/k", b"/v1/health"))[-1]
    assert status == 400
    assert headers["content-type"].startswith("application/json")
    error = json.loads(body)
    assert error["error"] == "bad_request" and "malformed HTTP request" in error["message"]
    assert raw_http(url, "GET", "/v1/health").status == 200


def test_the_answer_names_no_path_of_the_server(s3: S3Cluster) -> None:
    """The parser's message quotes the request's bytes, never a traceback."""
    for raw, _ in MALFORMED.values():
        for _, _, body in _send(s3.url, raw):
            assert b"Traceback" not in body and b".py" not in body
