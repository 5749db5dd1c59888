"""Bad input on the S3 gateway, byte for byte (issue 29).

Malformed, oversized and deeply nested XML; bad Range headers; part numbers and
upload ids no upload has; truncated and corrupt ``aws-chunked`` bodies; bodies
shorter or longer than declared, connections cut mid-body; bad checksums; keys no
path can hold; bad queries.  Hand-written cases, and hypothesis (derandomized,
bounded) around them, each request written onto a raw socket (an open cluster
takes unsigned requests).  Whatever comes, the answer is a 4xx (501 where S3 says
NotImplemented) with S3's XML error and ``x-amz-request-id``, never a 5xx or a
traceback, and a failed PUT or upload leaves its key as it was: absent (HEAD 404,
not listed) or holding its previous bytes exactly.  One ``stager up --s3-port 0``
serves the module; at its end the gateway's log holds no traceback of ours.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from s3_raw import (
    BUCKET,
    chunked_headers,
    crc32,
    create_upload,
    holds,
    listed,
    put,
    raw,
    readable,
    refused,
    request,
    send,
)

from stager.testing.s3cluster import S3Cluster

DATA = b"0123456789"
FUZZ = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Cluster]:
    with S3Cluster(tmp_path_factory.mktemp("s3fuzz")) as cluster:
        assert send(cluster, "PUT", f"/{BUCKET}").status == 200
        yield cluster


# -- XML bodies ---------------------------------------------------------------------------
def _parts(n: int, number: str = "") -> bytes:
    """``n`` parts numbered 1 to ``n`` (or all ``number``), each with the ETag ``x``."""
    return b"".join(b"<Part><PartNumber>" + (number or str(i + 1)).encode()
                    + b"</PartNumber><ETag>x</ETag></Part>" for i in range(n))


BAD_XML: dict[str, bytes | str] = {
    "not-xml": b"not xml at all",
    "truncated": b"<ROOT><Part><PartNumber>1",
    "wrong-root": b"<Other/>",
    "empty-root": b"<ROOT/>",
    "dtd": b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY e "keeper">]><ROOT>&e;</ROOT>',
    # a str: encoded as UTF-16 once ROOT is named (a check of the bytes missed its DTD)
    "dtd-in-utf16": '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE r [<!ENTITY e '
                    '"keeper">]><ROOT><Object><Key>&e;</Key></Object></ROOT>',
    "unknown-encoding": b'<?xml version="1.0" encoding="bogus"?><ROOT/>',
    "latin1-bytes": b"<ROOT>\xe9\xff</ROOT>",
    "nul": b"<ROOT>\x00</ROOT>",
    "char-ref-1": b"<ROOT>&#1;</ROOT>",
    "deeply-nested": b"<ROOT>" + b"<a>" * 100_000 + b"</a>" * 100_000 + b"</ROOT>",
    "oversized": b"<ROOT>" + b"<a/>" * 600_000 + b"</ROOT>",
    "unclosed-deep": b"<ROOT>" + b"<a>" * 200_000,
}


def xml_body(name: str, root: str) -> bytes:
    body = BAD_XML[name]
    if isinstance(body, str):
        return body.replace("ROOT", root).encode("utf-16")
    return body.replace(b"ROOT", root.encode())


# well-formed, with the right root: a CreateBucketConfiguration naming nothing we keep
WELL_FORMED = {"empty-root", "deeply-nested", "unknown-encoding"}


@pytest.mark.parametrize("name", BAD_XML)
def test_malformed_xml_bodies_change_nothing(s3: S3Cluster, name: str) -> None:
    put(s3, "keeper", b"kept")
    upload = create_upload(s3, "mp-xml")
    for method, path, root in [("POST", f"/{BUCKET}/mp-xml?uploadId={upload}",
                                "CompleteMultipartUpload"),
                               ("POST", f"/{BUCKET}?delete", "Delete")]:
        refused(send(s3, method, path, xml_body(name, root)), "MalformedXML")
    reply = send(s3, "PUT", "/fuzz-new-bucket", xml_body(name, "CreateBucketConfiguration"))
    if name in WELL_FORMED and reply.status == 200:
        assert send(s3, "DELETE", "/fuzz-new-bucket").status == 204
    else:     # aiohttp's limit on a body read whole is EntityTooLarge
        refused(reply, "MalformedXML", "EntityTooLarge")
    holds(s3, "keeper", b"kept")
    holds(s3, "mp-xml", None)
    assert send(s3, "HEAD", "/fuzz-new-bucket").status == 404
    assert send(s3, "DELETE", f"/{BUCKET}/mp-xml?uploadId={upload}").status == 204


@pytest.mark.parametrize("parts", [
    _parts(1, "0"), _parts(1, "-1"), _parts(1, "10001"), _parts(1, str(2 ** 64)),
    _parts(1, "1.5"), _parts(10_001),
    _parts(1, "\u00b2"),
], ids=["0", "-1", "10001", "2^64", "1.5", "10001-parts", "superscript-2"])
def test_complete_with_impossible_part_numbers(s3: S3Cluster, parts: bytes) -> None:
    upload = create_upload(s3, "mp-numbers")
    body = b"<CompleteMultipartUpload>" + parts + b"</CompleteMultipartUpload>"
    refused(send(s3, "POST", f"/{BUCKET}/mp-numbers?uploadId={upload}", body),
            "InvalidArgument", "MalformedXML", "InvalidPart")
    holds(s3, "mp-numbers", None)
    assert send(s3, "DELETE", f"/{BUCKET}/mp-numbers?uploadId={upload}").status == 204


def test_a_complete_body_that_arrives_in_two_pieces_is_read_whole(s3: S3Cluster) -> None:
    upload = create_upload(s3, "mp-slow")
    body = b"<CompleteMultipartUpload>" + _parts(1000) + b"</CompleteMultipartUpload>"
    data = request("POST", f"/{BUCKET}/mp-slow?uploadId={upload}", body)
    reply = raw(s3, data, method="POST", pause_at=len(data) - len(body) // 2)
    assert reply is not None
    send(s3, "DELETE", f"/{BUCKET}/mp-slow?uploadId={upload}")
    assert refused(reply) != "MalformedXML"         # today it is: the body was cut short


@given(body=st.one_of(st.binary(max_size=300), st.lists(st.sampled_from([
    "<Delete>", "</Delete>", "<Object>", "</Object>", "<Key>", "</Key>", "fuzz-k",
    "<Quiet>true</Quiet>", "&amp;", "&#0;", "<!DOCTYPE x>", "\u00b2", "\x01", "<", ">",
    "<?xml version='1.0'?>"]), max_size=12).map(lambda xs: "".join(xs).encode())))
@FUZZ
def test_any_delete_objects_body(s3: S3Cluster, body: bytes) -> None:
    reply = send(s3, "POST", f"/{BUCKET}?delete", body)
    if reply.status == 200:
        readable(reply)
    else:
        refused(reply, "MalformedXML")


# -- Range and partNumber ----------------------------------------------------------------
def check_range(s3: S3Cluster, header: str | bytes, method: str = "GET") -> None:
    """What a Range gets on the 10-byte ``ten``: 416 InvalidRange, the whole object
    (an ignored header), or exactly the bytes its Content-Range names."""
    reply = send(s3, method, f"/{BUCKET}/ten", headers={"Range": header})
    if reply.status == 416:
        refused(reply, "InvalidRange", method=method)
        assert reply.headers["content-range"] == f"bytes */{len(DATA)}"
    elif reply.status == 200:
        assert reply.body == (DATA if method == "GET" else b"")
    else:
        assert reply.status == 206, (reply.status, reply.body)
        first, last = map(int, re.fullmatch(r"bytes (\d+)-(\d+)/10",
                                            reply.headers["content-range"]).groups())
        assert reply.body == (DATA[first:last + 1] if method == "GET" else b"")
        assert 0 <= first <= last < len(DATA)


BAD_RANGES = ["bytes=5-2", "bytes=100-", "bytes=10-", "bytes=0-1,3-4", "bytes=0-1, -2",
              "garbage", "bytes=abc", "bytes=-0", "bytes=-", "bytes=", "bytes=1-2-3",
              "bytes=0x1-2", "items=0-1", "bytes=" + "9" * 40 + "-", "bytes=0-" + "9" * 40,
              "bytes=-" + "9" * 40, f"bytes={2 ** 64}-{2 ** 64 + 1}", "bytes=1 -2"]


@pytest.mark.parametrize("header", BAD_RANGES)
def test_bad_ranges(s3: S3Cluster, header: str) -> None:
    put(s3, "ten", DATA)
    check_range(s3, header)
    check_range(s3, header, "HEAD")


def test_a_range_in_digits_of_another_script_is_no_range(s3: S3Cluster) -> None:
    """``bytes=١-٢`` (Arabic-Indic digits; \\d matches them) named bytes 1-2: a 206."""
    put(s3, "ten", DATA)
    header = "bytes=\u0661-\u0662".encode()        # as UTF-8, as a client would send it
    reply = send(s3, "GET", f"/{BUCKET}/ten", headers={"Range": header})
    assert reply.status in (200, 416), (reply.status, reply.headers)
    check_range(s3, header)


@given(header=st.one_of(
    st.text(alphabet="bytes=-,0123456789 x", max_size=30),
    st.tuples(st.one_of(st.none(), st.integers(0, 2 ** 70)),
              st.one_of(st.none(), st.integers(-5, 2 ** 70))).map(
        lambda t: "bytes=" + ("" if t[0] is None else str(t[0])) + "-"
        + ("" if t[1] is None else str(t[1])))))
@FUZZ
def test_any_range(s3: S3Cluster, header: str) -> None:
    put(s3, "ten", DATA)
    check_range(s3, header)


PART_NUMBERS = ["0", "-1", "10001", str(2 ** 64), "abc", "", "1.5", "+1", "%C2%B2",
                "%D9%A1", "1e3", "0x1"]


@pytest.mark.parametrize("number", PART_NUMBERS)
def test_impossible_part_numbers(s3: S3Cluster, number: str) -> None:
    put(s3, "ten", DATA)
    for method in ("GET", "HEAD"):
        refused(send(s3, method, f"/{BUCKET}/ten?partNumber={number}"), "InvalidArgument",
                method=method)
    upload = create_upload(s3, "mp-part")
    reply = send(s3, "PUT", f"/{BUCKET}/mp-part?partNumber={number}&uploadId={upload}",
                 b"part")
    refused(reply, "InvalidArgument")
    parts = send(s3, "GET", f"/{BUCKET}/mp-part?uploadId={upload}")
    assert parts.status == 200 and b"<Part>" not in parts.body
    assert send(s3, "DELETE", f"/{BUCKET}/mp-part?uploadId={upload}").status == 204
    holds(s3, "ten", DATA)


@pytest.mark.parametrize("upload", ["", "x", "..%2F..%2Fetc", "0" * 32, "Z" * 32, "%00",
                                    "a" * 5000, "%FF"])
def test_upload_ids_no_upload_has(s3: S3Cluster, upload: str) -> None:
    complete = b"<CompleteMultipartUpload>" + _parts(1) + b"</CompleteMultipartUpload>"
    for method, query, body in [("PUT", "partNumber=1&", b"part"), ("POST", "", complete),
                                ("DELETE", "", b""), ("GET", "", b"")]:
        reply = send(s3, method, f"/{BUCKET}/mp-none?{query}uploadId={upload}", body)
        refused(reply, "NoSuchUpload", "InvalidArgument")
    holds(s3, "mp-none", None)


@pytest.mark.parametrize("source, span", [
    ("fuzz/ten", "bytes=5-2"), ("fuzz/ten", "bytes=0-100"), ("fuzz/ten", "bytes=-3"),
    ("fuzz/ten", "bytes=0-1,2-3"), ("fuzz/ten", "garbage"), ("fuzz/ten", "bytes=\u00b2-\u00b3"),
    ("fuzz/ten", "bytes=\u0661-\u0662"), ("fuzz", ""), ("fuzz/..%2Fetc", ""),
    ("no-such-bucket/ten", ""), ("fuzz/ten?versionId=3", ""),
    ("fuzz/%FF", ""),
])
def test_bad_copy_sources_and_ranges(s3: S3Cluster, source: str, span: str) -> None:
    put(s3, "ten", DATA)
    headers: dict[str, str | bytes] = {"x-amz-copy-source": source}
    if span:
        headers["x-amz-copy-source-range"] = span.encode()
    upload = create_upload(s3, "mp-copy")
    code = refused(send(s3, "PUT", f"/{BUCKET}/mp-copy?partNumber=1&uploadId={upload}",
                        headers=headers))
    if not span:
        assert refused(send(s3, "PUT", f"/{BUCKET}/copied", headers=headers)) == code
        holds(s3, "copied", None)
        if "%FF" in source:
            assert code == "InvalidURI"
    assert send(s3, "DELETE", f"/{BUCKET}/mp-copy?uploadId={upload}").status == 204


# -- bodies: aws-chunked, lengths, checksums --------------------------------------------
TRAILER = b"x-amz-checksum-crc32:" + crc32(b"hello").encode() + b"\r\n"
CHUNKED = {     # name -> (body, x-amz-decoded-content-length, more headers)
    "size-larger-than-sent": (b"a\r\nhello\r\n0\r\n\r\n", "10", {}),
    "bad-hex-size": (b"zz\r\nhello\r\n0\r\n\r\n", "5", {}),
    "negative-size": (b"-5\r\nhello\r\n0\r\n\r\n", "5", {}),
    "huge-size": (b"ffffffffffffffff\r\nhello\r\n0\r\n\r\n", "5", {}),
    "missing-final-chunk": (b"5\r\nhello\r\n", "5", {}),
    "cut-in-data": (b"5\r\nhel", "5", {}),
    "no-crlf-after-data": (b"5\r\nhelloXX0\r\n\r\n", "5", {}),
    "bad-chunk-signature": (b"5;chunk-signature=zz\r\nhello\r\n0\r\n\r\n", "5", {}),
    "bad-trailer-checksum": (b"5\r\nhello\r\n0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n",
                             "5", {"x-amz-trailer": "x-amz-checksum-crc32"}),
    "missing-trailer": (b"5\r\nhello\r\n0\r\n\r\n", "5",
                        {"x-amz-trailer": "x-amz-checksum-crc32"}),
    "unknown-trailer": (b"5\r\nhello\r\n0\r\n\r\n", "5", {"x-amz-trailer": "x-amz-md7"}),
    "trailer-without-colon": (b"5\r\nhello\r\n0\r\nnocolon\r\n\r\n", "5", {}),
    "decoded-length-short": (b"5\r\nhello\r\n0\r\n\r\n", "3", {}),
    "decoded-length-long": (b"5\r\nhello\r\n0\r\n\r\n", "9", {}),
    "decoded-length-negative": (b"5\r\nhello\r\n0\r\n\r\n", "-1", {}),
    "decoded-length-huge": (b"5\r\nhello\r\n0\r\n\r\n", str(2 ** 64), {}),
    "decoded-length-superscript": (b"5\r\nhello\r\n0\r\n\r\n", "\u00b2", {}),
    "decoded-length-missing": (b"5\r\nhello\r\n0\r\n\r\n", "", {}),
    "data-after-the-end": (b"5\r\nhello\r\n0\r\n\r\nEXTRA", "5", {}),
    "line-too-long": (b"5" + b"0" * 5000 + b"\r\nhello\r\n0\r\n\r\n", "5", {}),
    "too-many-trailers": (b"5\r\nhello\r\n0\r\n" + b"a:b\r\n" * 20 + b"\r\n", "5", {}),
}


@pytest.mark.parametrize("name", CHUNKED)
def test_bad_aws_chunked_bodies_leave_the_object_as_it_was(s3: S3Cluster, name: str) -> None:
    body, decoded, more = CHUNKED[name]
    put(s3, "chunked", b"previous")
    refused(send(s3, "PUT", f"/{BUCKET}/chunked", body, chunked_headers(decoded, **more)))
    holds(s3, "chunked", b"previous")
    refused(send(s3, "PUT", f"/{BUCKET}/chunked-new", body, chunked_headers(decoded, **more)))
    holds(s3, "chunked-new", None)
    upload = create_upload(s3, "mp-chunked")
    refused(send(s3, "PUT", f"/{BUCKET}/mp-chunked?partNumber=1&uploadId={upload}", body,
                 chunked_headers(decoded, **more)))
    parts = send(s3, "GET", f"/{BUCKET}/mp-chunked?uploadId={upload}")
    assert parts.status == 200 and b"<Part>" not in parts.body      # no part half-written
    assert send(s3, "DELETE", f"/{BUCKET}/mp-chunked?uploadId={upload}").status == 204


@given(cut=st.integers(0, 200), flip=st.integers(0, 200), byte=st.integers(0, 255),
       insert=st.binary(max_size=4))
@FUZZ
def test_any_corrupted_aws_chunked_body(s3: S3Cluster, cut: int, flip: int, byte: int,
                                        insert: bytes) -> None:
    data = b"hello, stager" * 3
    body = bytearray(b"".join(b"%x\r\n" % len(data[i:i + 10]) + data[i:i + 10] + b"\r\n"
                              for i in range(0, len(data), 10)))
    body += b"0\r\nx-amz-checksum-crc32:" + crc32(data).encode() + b"\r\n\r\n"
    flip %= len(body)
    body[flip] = byte
    body[flip:flip] = insert
    body = body[:len(body) - cut % 40]
    put(s3, "any-chunked", b"previous")
    reply = send(s3, "PUT", f"/{BUCKET}/any-chunked", bytes(body), chunked_headers(
        str(len(data)), **{"x-amz-trailer": "x-amz-checksum-crc32"}))
    if reply.status == 200:
        holds(s3, "any-chunked", data)      # a harmless change (a hex digit's case)
    else:
        refused(reply)
        holds(s3, "any-chunked", b"previous")


@pytest.mark.parametrize("how", ["plain", "aws-chunked", "transfer-chunked"])
def test_a_connection_closed_mid_body_leaves_the_object_as_it_was(s3: S3Cluster,
                                                                  how: str) -> None:
    put(s3, "cut", b"previous")
    headers: dict[str, str | bytes] = {"Content-Length": "1000000"}
    if how == "aws-chunked":
        headers.update(chunked_headers("20"), **{"Content-Length": "100"})
    elif how == "transfer-chunked":
        headers = {"Transfer-Encoding": "chunked", "Content-Length": None}  # type: ignore[dict-item]
    body = {"plain": b"z" * 5000, "aws-chunked": b"14\r\nabcdefghij",
            "transfer-chunked": b"5\r\nhello\r\n"}[how]
    upload = create_upload(s3, "cut")
    for half_close in (False, True):
        for path in (f"/{BUCKET}/cut", f"/{BUCKET}/cut?partNumber=1&uploadId={upload}"):
            reply = raw(s3, request("PUT", path, body, headers), method="PUT",
                        half_close=half_close, hang_up=not half_close)
            if reply is not None:
                refused(reply)
        time.sleep(0.5)         # the gateway sees the cut and aborts its write
        holds(s3, "cut", b"previous")
        parts = send(s3, "GET", f"/{BUCKET}/cut?uploadId={upload}")
        assert parts.status == 200 and b"<Part>" not in parts.body
    assert send(s3, "DELETE", f"/{BUCKET}/cut?uploadId={upload}").status == 204


def test_a_body_longer_than_its_content_length_is_a_shorter_put(s3: S3Cluster) -> None:
    """The bytes past Content-Length are a next request (refused by aiohttp), never
    part of this object."""
    for connection in ("close", "keep-alive"):
        put(s3, "longer", b"previous")
        reply = send(s3, "PUT", f"/{BUCKET}/longer", b"abcdefgh",
                     {"Content-Length": "3", "Connection": connection})
        assert reply.status < 500
        got = send(s3, "GET", f"/{BUCKET}/longer")
        assert got.status == 200 and got.body in (b"previous", b"abc")


CHECKSUMS = [
    ({"Content-MD5": "garbage"}, "InvalidDigest"), ({"Content-MD5": ""}, "InvalidDigest"),
    ({"Content-MD5": "AAAAAAAAAAAAAAAAAAAAAA=="}, "BadDigest"),
    ({"Content-MD5": b"\xc3\xbf"}, "InvalidDigest"),
    ({"x-amz-checksum-crc32": "garbage"}, "BadDigest"),
    ({"x-amz-checksum-crc32": ""}, "BadDigest"),
    ({"x-amz-checksum-crc32c": "AAAAAA=="}, "BadDigest"),
    ({"x-amz-checksum-sha256": "!!"}, "BadDigest"),
    ({"x-amz-checksum-sha1": "x" * 5000}, "BadDigest"),
    ({"x-amz-checksum-crc64nvme": "AAAAAAAAAAA="}, "BadDigest"),
    ({"x-amz-checksum-md7": "x"}, "InvalidRequest"),
    ({"x-amz-content-sha256": "0" * 64}, "XAmzContentSHA256Mismatch"),
    ({"x-amz-content-sha256": "garbage"}, "InvalidArgument"),
    ({"x-amz-checksum-algorithm": "MD7"}, "InvalidRequest"),
    ({"x-amz-sdk-checksum-algorithm": "\u00b2"}, "InvalidRequest"),
]


@pytest.mark.parametrize("headers, code", CHECKSUMS, ids=[str(i) for i in range(len(CHECKSUMS))])
def test_bad_checksums_leave_the_object_as_it_was(s3: S3Cluster, headers: dict[str, str],
                                                  code: str) -> None:
    put(s3, "summed", b"previous")
    refused(send(s3, "PUT", f"/{BUCKET}/summed", b"new bytes", headers), code)
    holds(s3, "summed", b"previous")
    upload = create_upload(s3, "mp-summed")
    refused(send(s3, "PUT", f"/{BUCKET}/mp-summed?partNumber=1&uploadId={upload}",
                 b"new bytes", headers), code)
    parts = send(s3, "GET", f"/{BUCKET}/mp-summed?uploadId={upload}")
    assert parts.status == 200 and b"<Part>" not in parts.body
    assert send(s3, "DELETE", f"/{BUCKET}/mp-summed?uploadId={upload}").status == 204


@given(name=st.sampled_from(["Content-MD5", "x-amz-checksum-crc32", "x-amz-checksum-sha256",
                             "x-amz-content-sha256", "x-amz-checksum-algorithm",
                             "x-amz-decoded-content-length", "Content-Type", "x-amz-meta-a",
                             "If-None-Match", "Cache-Control", "Content-Encoding"]),
       value=st.binary(max_size=24).filter(lambda v: all(c >= 0x20 and c != 0x7f for c in v)))
@FUZZ
def test_any_put_header(s3: S3Cluster, name: str, value: bytes) -> None:
    """A header a value aiohttp passes on: the PUT stores ``new`` whole or changes
    nothing, and the object it leaves reads back."""
    put(s3, "headed", b"previous")
    reply = send(s3, "PUT", f"/{BUCKET}/headed", b"new", {name: value})
    if reply.status != 200:
        refused(reply)
    got = send(s3, "GET", f"/{BUCKET}/headed")
    assert (got.status, got.body) == (200, b"new" if reply.status == 200 else b"previous")
    assert send(s3, "HEAD", f"/{BUCKET}/headed").status == 200


# -- keys and queries -----------------------------------------------------------------------
BAD_KEYS = ["%00", "a%00b", "..", "a/../b", "%2e%2e/x", "./a", "a/.", "a//b", "k" * 1025,
            "%FF", "%C0%AF", "%ED%A0%80", "a%80b", "%ZZ", "%", "a%2", "%EF%BF%BE", "a%0Ab",
            "a%0D%0Ab", "%01"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_keys_no_path_can_hold(s3: S3Cluster, key: str) -> None:
    before = listed(s3)
    for method in ("PUT", "GET", "HEAD", "DELETE", "POST"):
        query = "?uploads" if method == "POST" else ""
        refused(send(s3, method, f"/{BUCKET}/{key}{query}", b"x" if method == "PUT" else b""),
                "InvalidArgument", "InvalidURI", "KeyTooLongError", method=method)
    assert listed(s3) == before


@given(key=st.binary(min_size=1, max_size=40))
@FUZZ
def test_any_key(s3: S3Cluster, key: bytes) -> None:
    path = f"/{BUCKET}/fz-" + quote(key, safe="")
    reply = send(s3, "PUT", path, b"any")
    if reply.status != 200:
        refused(reply, "InvalidArgument", "InvalidURI", "KeyTooLongError", "InvalidRequest")
        return
    got = send(s3, "GET", path)
    assert (got.status, got.body) == (200, b"any")
    listed(s3)                                  # XML any parser reads, whatever the key
    assert send(s3, "DELETE", path).status == 204


BAD_QUERIES = [
    "list-type=2&max-keys=-1", "list-type=2&max-keys=abc", "list-type=2&max-keys=%C2%B2",
    "list-type=2&max-keys=%D9%A1", "list-type=2&continuation-token=%25%25garbage",
    "list-type=2&continuation-token=_w", "list-type=2&continuation-token=gA%3D%3D",
    "list-type=3", "list-type=1", "list-type=", "list-type=2&encoding-type=%01",
    "uploads&max-uploads=%C2%B2", "uploads&max-uploads=-1", "max-keys=" + "9" * 30,
]


@pytest.mark.parametrize("query", BAD_QUERIES)
def test_bad_list_queries(s3: S3Cluster, query: str) -> None:
    refused(send(s3, "GET", f"/{BUCKET}?{query}"), "InvalidArgument")


@pytest.mark.parametrize("query", ["response-content-type=%0D%0AX-Evil:%201",
                                   "response-content-type=%01", "response-expires=%0A"])
def test_response_overrides_a_header_cannot_carry(s3: S3Cluster, query: str) -> None:
    put(s3, "ten", DATA)
    reply = send(s3, "GET", f"/{BUCKET}/ten?{query}")
    refused(reply, "InvalidArgument")
    assert "x-evil" not in reply.headers


@pytest.mark.parametrize("query", ["list-type=2&prefix=%01", "uploads&prefix=%01",
                                   "uploads&key-marker=%FF", "list-type=2&delimiter=%FF",
                                   "prefix=%EF%BF%BE"])
def test_listings_echoing_odd_text_are_xml(s3: S3Cluster, query: str) -> None:
    reply = send(s3, "GET", f"/{BUCKET}?{query}")
    if reply.status >= 400:
        refused(reply)
    else:
        readable(reply)


@given(name=st.sampled_from(["max-keys", "max-uploads", "partNumber", "list-type",
                             "continuation-token", "start-after", "prefix", "delimiter",
                             "encoding-type", "part-number-marker", "max-parts", "marker"]),
       value=st.binary(max_size=12))
@FUZZ
def test_any_query_value(s3: S3Cluster, name: str, value: bytes) -> None:
    for path in (f"/{BUCKET}?uploads&", f"/{BUCKET}?", f"/{BUCKET}/ten?"):
        reply = send(s3, "GET", path + f"{name}={quote(value, safe='')}")
        if reply.status < 400:
            readable(reply)
        else:
            refused(reply)


def test_the_gateway_logged_no_traceback(s3: S3Cluster) -> None:
    """Every refusal above was an answer, never a fault of ours logged with its stack
    (aiohttp's own parser logs the requests it refuses: not ours, no stager frame)."""
    log = (s3.cluster_dir / "s3" / "server.log").read_text(errors="replace")
    records = re.split(r"\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ )", log)
    ours = [r for r in records if "Traceback" in r and "/stager/" in r]
    assert not ours, ours[0][-3000:]
