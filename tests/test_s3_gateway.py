"""The S3 gateway in process, with raw requests: aws-chunked bodies, bad input.

The gateway app runs in a thread (:class:`stager.testing.s3cluster.S3Thread`) over
the module's in-process cluster; requests are sent byte for byte (``raw_http``),
so malformed bodies, truncated chunked encodings and hostile keys reach it as a
client could send them.  Every refusal must be S3's XML error with its code and a
request id, never a 5xx, and must leave nothing visible: no object, no listing
entry, no stager file.  The decoder alone is `test_s3_chunked`; generated and
hand-written hostile input against a whole cluster is `test_s3_fuzz`.
"""

from __future__ import annotations

import base64
import hashlib
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Iterator

import pytest
from awscrt.checksums import crc64nvme
from conftest import Reply, raw_http, start_cluster

from stager.client import Client
from stager.config import load_config
from stager.protocol.models import LayoutSpec
from stager.s3 import app as s3app
from stager.s3 import context as s3context
from stager.testing.cluster import ThreadCluster
from stager.testing.s3cluster import S3Thread

BUCKET = "gw-bucket"


@pytest.fixture(scope="module")
def s3(cluster: ThreadCluster) -> Iterator[S3Thread]:
    with S3Thread(cluster.meta_url, domain="s3.test") as gw:
        assert raw_http(gw.url, "PUT", f"/{BUCKET}").status == 200
        yield gw


def code(reply: Reply) -> str:
    """The S3 error code of an answer (and the checks every error answer passes)."""
    assert reply.status < 500 or reply.status in (501, 503), reply.body
    assert reply.headers["x-amz-request-id"]
    root = ET.fromstring(reply.body)
    assert root.tag == "Error"
    assert root.findtext("RequestId") == reply.headers["x-amz-request-id"]
    return str(root.findtext("Code"))


def invisible(s3: S3Thread, client: Client, key: str) -> None:
    """Nothing of ``key`` can be seen: not by HEAD, a listing, or stager itself."""
    assert raw_http(s3.url, "HEAD", f"/{BUCKET}/{key}").status == 404
    listing = raw_http(s3.url, "GET", f"/{BUCKET}?list-type=2&prefix={key}")
    assert listing.status == 200 and b"<Key>" not in listing.body
    assert not client.exists(f"/{BUCKET}/{key}")


def chunked(data: bytes, sizes: int = 7, trailer: bytes = b"") -> bytes:
    out = b""
    for at in range(0, len(data), sizes):
        piece = data[at:at + sizes]
        out += b"%x\r\n" % len(piece) + piece + b"\r\n"
    return out + b"0\r\n" + trailer + b"\r\n"


def crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def streaming_headers(data: bytes, **more: str) -> dict[str, str]:
    return {"Content-Encoding": "aws-chunked",
            "x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
            "x-amz-decoded-content-length": str(len(data)),
            "x-amz-trailer": "x-amz-checksum-crc32", **more}


# -- aws-chunked -------------------------------------------------------------------------
def test_a_chunked_body_with_its_crc32_trailer_is_stored_byte_exact(
        s3: S3Thread, client: Client) -> None:
    data = bytes(range(256)) * 33
    body = chunked(data, 1000, f"x-amz-checksum-crc32:{crc32_b64(data)}\r\n".encode())
    reply = raw_http(s3.url, "PUT", f"/{BUCKET}/ok/chunked", body, streaming_headers(data))
    assert reply.status == 200, reply.body
    assert reply.headers["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    assert reply.headers["x-amz-checksum-crc32"] == crc32_b64(data)
    assert client.cat(f"/{BUCKET}/ok/chunked") == data
    got = raw_http(s3.url, "GET", f"/{BUCKET}/ok/chunked")
    assert got.body == data and got.headers["Content-Length"] == str(len(data))


@pytest.mark.parametrize("name, body, want", [
    ("bad-crc", chunked(b"hello world", 4, b"x-amz-checksum-crc32:AAAAAA==\r\n"),
     "BadDigest"),
    ("truncated", b"100\r\nhello", "IncompleteBody"),
    ("bad-size-line", b"zz\r\nhello\r\n0\r\n\r\n", "InvalidArgument"),
    ("no-crlf-after-data", b"5\r\nhelloXX0\r\n\r\n", "InvalidArgument"),
    ("short-of-decoded-length", chunked(b"hello", 5, b"x-amz-checksum-crc32:"
                                        + crc32_b64(b"hello").encode() + b"\r\n"),
     "IncompleteBody"),
    ("trailer-missing", chunked(b"hello world", 4), "InvalidRequest"),
    ("size-line-too-long", b"1" * 70000 + b"\r\n", "InvalidArgument"),
])
def test_a_bad_chunked_body_is_refused_and_nothing_is_visible(
        s3: S3Thread, client: Client, name: str, body: bytes, want: str) -> None:
    reply = raw_http(s3.url, "PUT", f"/{BUCKET}/bad/{name}", body,
                     streaming_headers(b"hello world"))
    assert reply.status == 400
    assert code(reply) == want
    invisible(s3, client, f"bad/{name}")


def test_checksum_headers_are_verified(s3: S3Thread, client: Client) -> None:
    data = b"checked bytes" * 1000
    good = {"x-amz-checksum-crc32": crc32_b64(data),
            "x-amz-checksum-sha256": base64.b64encode(hashlib.sha256(data).digest()).decode(),
            "Content-MD5": base64.b64encode(hashlib.md5(data).digest()).decode(),
            "x-amz-content-sha256": hashlib.sha256(data).hexdigest(),
            "x-amz-checksum-crc64nvme": base64.b64encode(
                crc64nvme(data).to_bytes(8, "big")).decode()}
    reply = raw_http(s3.url, "PUT", f"/{BUCKET}/sum/good", data, good)
    assert reply.status == 200, reply.body
    assert reply.headers["x-amz-checksum-sha256"] == good["x-amz-checksum-sha256"]
    assert reply.headers["x-amz-checksum-crc64nvme"] == good["x-amz-checksum-crc64nvme"]
    assert client.cat(f"/{BUCKET}/sum/good") == data
    for header, value, want in [
            ("Content-MD5", base64.b64encode(b"0" * 16).decode(), "BadDigest"),
            ("Content-MD5", "not-base64!", "InvalidDigest"),
            ("x-amz-checksum-crc32", "AAAAAA==", "BadDigest"),
            ("x-amz-checksum-crc32c", "AAAAAA==", "BadDigest"),
            ("x-amz-checksum-sha1", "AAAAAAAAAAAAAAAAAAAAAAAAAAA=", "BadDigest"),
            ("x-amz-content-sha256", "0" * 64, "XAmzContentSHA256Mismatch"),
            ("x-amz-checksum-crc64nvme", "AAAAAAAAAAA=", "BadDigest"),
            ("x-amz-checksum-md5", "AAAAAAAAAAAAAAAAAAAAAA==", "InvalidRequest")]:
        reply = raw_http(s3.url, "PUT", f"/{BUCKET}/sum/bad", data, {header: value})
        assert (reply.status, code(reply)) == (400, want), header
        invisible(s3, client, "sum/bad")


def test_a_failed_overwrite_keeps_the_old_object(s3: S3Thread, client: Client) -> None:
    assert raw_http(s3.url, "PUT", f"/{BUCKET}/keep", b"old bytes").status == 200
    reply = raw_http(s3.url, "PUT", f"/{BUCKET}/keep", b"new bytes",
                     {"x-amz-checksum-crc32": "AAAAAA=="})
    assert code(reply) == "BadDigest"
    assert raw_http(s3.url, "GET", f"/{BUCKET}/keep").body == b"old bytes"


# -- bad requests ------------------------------------------------------------------------
def test_malformed_delete_objects_xml_deletes_nothing(s3: S3Thread, client: Client) -> None:
    assert raw_http(s3.url, "PUT", f"/{BUCKET}/stays", b"x").status == 200
    for body in [b"<Delete><Object><Key>stays", b"not xml at all",
                 b"<Other><Object><Key>stays</Key></Object></Other>",
                 b"<Delete></Delete>", b"<Delete><Object></Object></Delete>",
                 b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY e "stays">]>'
                 b"<Delete><Object><Key>&e;</Key></Object></Delete>",
                 b"<Delete>" + b"<Object><Key>stays</Key></Object>" * 1001 + b"</Delete>"]:
        reply = raw_http(s3.url, "POST", f"/{BUCKET}?delete", body)
        assert (reply.status, code(reply)) == (400, "MalformedXML"), body[:60]
    assert client.cat(f"/{BUCKET}/stays") == b"x"


@pytest.mark.parametrize("header", ["bytes=5-2", "bytes=100-", "bytes=-0", "bytes=abc",
                                    "bytes=-"])
def test_bad_ranges_are_invalid_range(s3: S3Thread, header: str) -> None:
    assert raw_http(s3.url, "PUT", f"/{BUCKET}/ten", b"0123456789").status == 200
    reply = raw_http(s3.url, "GET", f"/{BUCKET}/ten", headers={"Range": header})
    assert (reply.status, code(reply)) == (416, "InvalidRange")
    assert reply.headers["Content-Range"] == "bytes */10"


@pytest.mark.parametrize("key, want", [
    ("k" * 1025, "KeyTooLongError"),
    ("a/" + "b" * 300, "InvalidArgument"),
    ("a/../../etc", "InvalidArgument"),
    ("a/%2e%2e/b", "InvalidArgument"),
    ("a//b", "InvalidArgument"),
    ("nul%00name", "InvalidArgument"),
    ("ctl%01name", "InvalidArgument"),
])
def test_keys_without_a_path_are_refused(s3: S3Thread, client: Client, key: str,
                                         want: str) -> None:
    reply = raw_http(s3.url, "PUT", f"/{BUCKET}/{key}", b"data")
    assert (reply.status, code(reply)) == (400, want)
    assert raw_http(s3.url, "GET", f"/{BUCKET}/{key}").status == 400
    assert [e.name for e in client.ls("/")].count("etc") == 0


def test_a_put_to_a_missing_bucket_creates_nothing(s3: S3Thread, client: Client) -> None:
    reply = raw_http(s3.url, "PUT", "/no-such-bucket/k", b"data")
    assert (reply.status, code(reply)) == (404, "NoSuchBucket")
    assert not client.exists("/no-such-bucket")
    for method, path in [("GET", "/no-such-bucket"), ("GET", "/no-such-bucket/k"),
                         ("DELETE", "/no-such-bucket")]:
        assert code(raw_http(s3.url, method, path)) == "NoSuchBucket"


@pytest.mark.parametrize("name", ["ab", "UPPER", "-dash", "a" * 64, "under_score"])
def test_bad_bucket_names(s3: S3Thread, client: Client, name: str) -> None:
    reply = raw_http(s3.url, "PUT", f"/{name}")
    assert (reply.status, code(reply)) == (400, "InvalidBucketName")
    assert not client.exists(f"/{name}")


def test_the_gateways_own_directory_is_no_bucket(s3: S3Thread) -> None:
    assert raw_http(s3.url, "PUT", f"/{BUCKET}/attrs-made", b"x").status == 200
    assert b"<Name>.s3</Name>" not in raw_http(s3.url, "GET", "/").body
    for method, path in [("PUT", "/.s3"), ("GET", "/.s3"), ("GET", "/.s3/attrs"),
                         ("DELETE", "/.s3")]:
        assert code(raw_http(s3.url, method, path)) == "InvalidBucketName"


def test_multipart_requests_go_to_their_module(s3: S3Thread,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3app, "MULTIPART_MODULE", "stager.s3.not_there")
    for method, query in [("POST", "uploads"), ("PUT", "partNumber=1&uploadId=u"),
                          ("POST", "uploadId=u"), ("DELETE", "uploadId=u"),
                          ("GET", "uploadId=u")]:
        reply = raw_http(s3.url, method, f"/{BUCKET}/mp?{query}", b"")
        assert (reply.status, code(reply)) == (501, "NotImplemented")
    assert code(raw_http(s3.url, "GET", f"/{BUCKET}?uploads")) == "NotImplemented"


def test_virtual_hosted_style(s3: S3Thread, client: Client) -> None:
    port = s3.url.rsplit(":", 1)[1]
    host = {"Host": f"{BUCKET}.s3.test:{port}"}
    assert raw_http(s3.url, "PUT", "/vhost/key", b"by host", host).status == 200
    assert client.cat(f"/{BUCKET}/vhost/key") == b"by host"
    assert raw_http(s3.url, "GET", "/vhost/key", headers=host).body == b"by host"
    listing = raw_http(s3.url, "GET", "/?list-type=2&prefix=vhost/", headers=host)
    assert b"<Key>vhost/key</Key>" in listing.body


def test_unsupported_subresources_and_methods(s3: S3Thread) -> None:
    assert code(raw_http(s3.url, "GET", f"/{BUCKET}?versioning")) == "NotImplemented"
    assert code(raw_http(s3.url, "GET", f"/{BUCKET}/ten?acl")) == "NotImplemented"
    assert code(raw_http(s3.url, "PATCH", f"/{BUCKET}/ten")) == "MethodNotAllowed"
    assert code(raw_http(s3.url, "GET", f"/{BUCKET}?list-type=2&max-keys=x")) \
        == "InvalidArgument"
    assert code(raw_http(s3.url, "GET", f"/{BUCKET}?list-type=2&continuation-token=zz")) \
        == "InvalidArgument"


def test_a_key_cannot_be_both_an_object_and_a_prefix(s3: S3Thread, client: Client) -> None:
    assert raw_http(s3.url, "PUT", f"/{BUCKET}/both/x", b"1").status == 200
    reply = raw_http(s3.url, "PUT", f"/{BUCKET}/both", b"2")
    assert (reply.status, code(reply)) == (400, "InvalidRequest")
    reply = raw_http(s3.url, "PUT", f"/{BUCKET}/both/x/y", b"3")
    assert (reply.status, code(reply)) == (400, "InvalidRequest")
    assert client.cat(f"/{BUCKET}/both/x") == b"1"


def test_folder_keys_are_directories(s3: S3Thread, client: Client) -> None:
    assert raw_http(s3.url, "PUT", f"/{BUCKET}/folder/sub/", b"").status == 200
    assert client.stat(f"/{BUCKET}/folder/sub").is_dir
    assert code(raw_http(s3.url, "PUT", f"/{BUCKET}/folder/x/", b"bytes")) \
        == "InvalidArgument"
    head = raw_http(s3.url, "HEAD", f"/{BUCKET}/folder/sub/")
    assert head.status == 200 and head.headers["Content-Length"] == "0"
    listing = raw_http(s3.url, "GET", f"/{BUCKET}?list-type=2&prefix=folder/")
    assert b"<Key>folder/sub/</Key>" in listing.body
    assert raw_http(s3.url, "DELETE", f"/{BUCKET}/folder/sub/").status == 204
    assert not client.exists(f"/{BUCKET}/folder/sub")


def test_every_answer_carries_a_request_id(s3: S3Thread) -> None:
    for method, path in [("GET", "/"), ("HEAD", f"/{BUCKET}"), ("GET", f"/{BUCKET}/ten"),
                         ("GET", f"/{BUCKET}/missing"), ("GET", f"/{BUCKET}?location")]:
        reply = raw_http(s3.url, method, path)
        assert reply.headers["x-amz-request-id"] and reply.headers["x-amz-id-2"], path


def test_a_body_over_max_upload_size_is_entity_too_large(cluster: ThreadCluster,
                                                         client: Client) -> None:
    with S3Thread(cluster.meta_url, max_upload_size=4096) as small:
        assert raw_http(small.url, "PUT", f"/{BUCKET}/small", b"x" * 4096).status == 200
        reply = raw_http(small.url, "PUT", f"/{BUCKET}/large", b"x" * 4097)
        assert (reply.status, code(reply)) == (400, "EntityTooLarge")
        data = b"y" * 5000
        reply = raw_http(small.url, "PUT", f"/{BUCKET}/large", chunked(data, 1000),
                         {**streaming_headers(data), "x-amz-trailer": ""})
        assert (reply.status, code(reply)) == (400, "EntityTooLarge")
        assert not client.exists(f"/{BUCKET}/large")


def test_listings_come_in_key_order_page_by_page(s3: S3Thread, client: Client) -> None:
    """Directories sort as ``name/`` among files (``a.txt`` < ``a/``): pages of every size,
    with and without a delimiter, give S3's order, each key once."""
    names = ["a", "a.txt", "a-b", "a!", "a0", "a/b", "a/b.c", "a/b/c", "a.d/e", "a-b-/x",
             "b", "ab", "z/y/x", "é", "é/x"]
    files = [n for n in names if not any(m.startswith(n + "/") for m in names)]
    client.write_many([(f"/{BUCKET}/order/{n}", n.encode()) for n in files])
    keys = sorted((f"order/{n}" for n in files), key=lambda k: k.encode())
    for delimiter in ("", "/"):
        (whole,) = _pages(s3, "order/", delimiter, 1000)
        if not delimiter:
            assert whole == keys
        for size in (1, 2, 3, 5):
            pages = _pages(s3, "order/", delimiter, size)
            flat = [k for page in pages for k in page]
            assert sorted(flat) == sorted(whole) and len(flat) == len(whole)
            for before, after in zip(pages, pages[1:], strict=False):
                assert max(k.encode() for k in before) < min(k.encode() for k in after)


def _pages(s3: S3Thread, prefix: str, delimiter: str, max_keys: int) -> list[list[str]]:
    out: list[list[str]] = []
    token = ""
    while True:
        query = f"list-type=2&prefix={prefix}&max-keys={max_keys}&delimiter={delimiter}"
        if token:
            query += f"&continuation-token={token}"
        root = ET.fromstring(raw_http(s3.url, "GET", f"/{BUCKET}?{query}").body)
        ns = {"s": root.tag[1:].split("}")[0]}
        page = [e.text or "" for e in root.findall("s:Contents/s:Key", ns)] + \
            [e.text or "" for e in root.findall("s:CommonPrefixes/s:Prefix", ns)]
        assert len(page) <= max_keys
        out.append(page)
        if root.findtext("s:IsTruncated", namespaces=ns) != "true":
            return out
        token = root.findtext("s:NextContinuationToken", namespaces=ns) or ""


HOSTILE = [
    ("GET", f"/{BUCKET}/ten?partNumber=99999999999999999999", {}, b""),
    ("GET", f"/{BUCKET}/ten", {"Range": "bytes=99999999999999999999999-"}, b""),
    ("GET", f"/{BUCKET}/ten", {"If-Modified-Since": "Mon, 99 Foo"}, b""),
    ("GET", f"/{BUCKET}/ten?partNumber=1", {"Range": "bytes=0-1"}, b""),
    ("PUT", f"/{BUCKET}/copy", {"x-amz-copy-source": "%"}, b""),
    ("PUT", f"/{BUCKET}/copy", {"x-amz-copy-source": f"/{BUCKET}/../x"}, b""),
    ("PUT", f"/{BUCKET}/copy", {"x-amz-copy-source": f"/{BUCKET}/ten",
                                "x-amz-metadata-directive": "MOVE"}, b""),
    ("PUT", f"/{BUCKET}/k", {"x-amz-decoded-content-length": "-5",
                             "Content-Encoding": "aws-chunked"}, b"0\r\n\r\n"),
    ("PUT", f"/{BUCKET}/k", {"x-amz-meta-big": "x" * 3000}, b"data"),
    ("PUT", f"/{BUCKET}/k?uploadId=u", {}, b""),
    ("PUT", "/new-bucket-xml", {}, b"<CreateBucketConfiguration><Loc"),
    ("PUT", "/new-bucket-big", {}, b"<a>" + b"x" * (3 << 20) + b"</a>"),
    ("POST", f"/{BUCKET}?delete", {}, b"\xff\xfe<Delete>"),
    ("POST", f"/{BUCKET}/k", {}, b""),
    ("GET", f"/{BUCKET}?list-type=2&prefix=../&delimiter=/", {}, b""),
    ("GET", f"/{BUCKET}?list-type=2&prefix=%00&start-after=%ff", {}, b""),
    ("GET", f"/{BUCKET}?list-type=2&delimiter=%01", {}, b""),
    ("GET", f"/{BUCKET}?marker=%1f", {}, b""),
    ("GET", f"/{BUCKET}?list-type=2&encoding-type=base64", {}, b""),
    ("GET", "/%ZZ/%C0%AF", {}, b""),
    ("DELETE", f"/{BUCKET}/a/..", {}, b""),
    ("HEAD", f"/{BUCKET}/" + "x" * 5000, {}, b""),
]


@pytest.mark.parametrize("method, path, headers, body", HOSTILE,
                         ids=[f"{m}-{i}" for i, (m, *_) in enumerate(HOSTILE)])
def test_hostile_requests_get_s3_errors_not_5xx(s3: S3Thread, client: Client, method: str,
                                                path: str, headers: dict[str, str],
                                                body: bytes) -> None:
    raw_http(s3.url, "PUT", f"/{BUCKET}/ten", b"0123456789")
    reply = raw_http(s3.url, method, path, body, headers)
    assert reply.status < 500 or reply.status == 501, (reply.status, reply.body)
    if method != "HEAD" and reply.status >= 400:
        code(reply)
    elif method != "HEAD" and reply.headers.get("Content-Type") == "application/xml":
        ET.fromstring(reply.body)           # an answer any XML parser reads
    assert not client.exists(f"/{BUCKET}/k") and not client.exists(f"/{BUCKET}/copy")
    assert not client.exists("/new-bucket-xml") and not client.exists("/new-bucket-big")


def test_a_get_that_fails_midway_is_cut_short_never_whole_looking(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A data server lost after the answer's headers went out: the gateway cannot send
    an error any more, so it closes the connection; the client gets fewer bytes than
    Content-Length said, never a wrong body that looks whole."""
    import http.client

    lossy = start_cluster(tmp_path_factory.mktemp("s3-lossy"), 2)
    try:
        with Client(lossy.meta_url, config=load_config(env={})) as c, \
                S3Thread(lossy.meta_url) as gw:
            c.mkdir("/lossy")
            size = 48 << 20
            c.pipe("/lossy/big", bytes(size), layout=LayoutSpec(chunk_size=1 << 20))
            host, port = gw.url.rsplit("//", 1)[1].split(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            conn.request("GET", "/lossy/big")
            reply = conn.getresponse()
            assert reply.status == 200 and int(reply.headers["Content-Length"]) == size
            got = len(reply.read(1 << 20))
            lossy.stop_data(1)
            try:
                while piece := reply.read(1 << 20):     # b"" once the server closed
                    got += len(piece)
            except http.client.IncompleteRead as short:
                got += len(short.partial)
            assert got < size
            conn.close()
    finally:
        lossy.stop()


async def test_clients_evicted_from_the_gateway_are_closed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One client per token, the oldest evicted past KEPT_CLIENTS and closed later or at
    the gateway's close: no session is left open."""
    monkeypatch.setattr(s3context, "KEPT_CLIENTS", 1)
    gateway = s3context.Gateway("http://127.0.0.1:9", load_config(env={}))
    first = gateway.client("token-1")
    session = first.plane.session           # opened by its first use
    second = gateway.client("token-2")
    assert gateway.client("token-2") is second
    assert gateway.client("token-1") is not first     # evicted: a new one
    assert not session.closed                          # still lent to its requests
    await gateway.close()
    assert session.closed
