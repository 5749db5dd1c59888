"""stager/s3/sigv4.py against botocore's own signer and AWS's published examples.

botocore signs (header auth with a signed or an unsigned payload, presigned URLs);
our parse + verify must accept exactly what it signs and refuse any change to what
the signature covers.  The examples of AWS's "Signature Calculations" pages (a GET
with a range, a PUT, a query, a presigned URL, a body in signed chunks with and
without a trailer) pin the algorithm to the published signatures.
"""

from __future__ import annotations

import datetime
import hashlib
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from botocore import auth as botoauth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import given, settings
from hypothesis import strategies as st

from stager.s3 import sigv4
from stager.s3.errors import S3Error

AKID, SECRET = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
EXAMPLE_DATE = "20130524T000000Z"
EXAMPLE_NOW = 1369353600.0                      # 2013-05-24T00:00:00Z
SCOPE = sigv4.Scope("20130524", "us-east-1", "s3")


def checked(method: str, target: str, headers: list[tuple[str, str]], *,
            secret: str = SECRET, now: float = EXAMPLE_NOW) -> sigv4.SignedRequest:
    """Parse, check the time and verify, as the gateway and the metadata server do."""
    signed = sigv4.parse(method, target, headers)
    assert signed is not None
    sigv4.check_time(signed, now)
    sigv4.verify(sigv4.signing_key(secret, signed.scope), signed)
    return signed


def refused(code: str, method: str, target: str, headers: list[tuple[str, str]], *,
            now: float = EXAMPLE_NOW, secret: str = SECRET) -> S3Error:
    with pytest.raises(S3Error) as info:
        checked(method, target, headers, now=now, secret=secret)
    assert info.value.code == code, info.value.message
    return info.value


# -- AWS's published examples ------------------------------------------------------------
GET_OBJECT = [("Host", "examplebucket.s3.amazonaws.com"), ("Range", "bytes=0-9"),
              ("x-amz-content-sha256", sigv4.EMPTY_SHA256), ("x-amz-date", EXAMPLE_DATE),
              ("Authorization", f"AWS4-HMAC-SHA256 Credential={AKID}/20130524/us-east-1/s3/"
                                "aws4_request,SignedHeaders=host;range;x-amz-content-sha256;"
                                "x-amz-date,Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f"
                                "0170aba48dd91039c6036bdb41")]


def test_aws_example_get_object() -> None:
    signed = checked("GET", "/test.txt", GET_OBJECT)
    assert signed.string_to_sign.splitlines() == [
        "AWS4-HMAC-SHA256", EXAMPLE_DATE, "20130524/us-east-1/s3/aws4_request",
        "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972"]
    assert (signed.access_key, signed.scope, signed.presigned) == (AKID, SCOPE, False)


def test_aws_example_put_object() -> None:
    headers = [("Host", "examplebucket.s3.amazonaws.com"),
               ("Date", "Fri, 24 May 2013 00:00:00 GMT"), ("x-amz-date", EXAMPLE_DATE),
               ("x-amz-storage-class", "REDUCED_REDUNDANCY"),
               ("x-amz-content-sha256", hashlib.sha256(b"Welcome to Amazon S3.").hexdigest()),
               ("Authorization", f"AWS4-HMAC-SHA256 Credential={AKID}/20130524/us-east-1/s3/"
                                 "aws4_request,SignedHeaders=date;host;x-amz-content-sha256;"
                                 "x-amz-date;x-amz-storage-class,Signature=98ad721746da40c64"
                                 "f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd")]
    checked("PUT", "/test%24file.text", headers)


@pytest.mark.parametrize("target, signature", [
    ("/?lifecycle", "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"),
    ("/?max-keys=2&prefix=J", "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"),
])
def test_aws_example_bucket_queries(target: str, signature: str) -> None:
    headers = [("Host", "examplebucket.s3.amazonaws.com"),
               ("x-amz-content-sha256", sigv4.EMPTY_SHA256), ("x-amz-date", EXAMPLE_DATE),
               ("Authorization", f"AWS4-HMAC-SHA256 Credential={AKID}/20130524/us-east-1/s3/"
                                 "aws4_request,SignedHeaders=host;x-amz-content-sha256;"
                                 f"x-amz-date,Signature={signature}")]
    checked("GET", target, headers)


PRESIGNED = ("/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE"
             "%2F20130524%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20130524T000000Z&"
             "X-Amz-Expires=86400&X-Amz-SignedHeaders=host&X-Amz-Signature=aeeed9bbccd4d02ee5"
             "c0109b86d86835f995330da4c265957d157751f604d404")
PRESIGNED_HOST = [("Host", "examplebucket.s3.amazonaws.com")]


def test_aws_example_presigned_url_and_its_expiry() -> None:
    signed = checked("GET", PRESIGNED, PRESIGNED_HOST)
    assert signed.presigned and signed.expires == 86400
    checked("GET", PRESIGNED, PRESIGNED_HOST, now=EXAMPLE_NOW + 86400)     # its last second
    err = refused("AccessDenied", "GET", PRESIGNED, PRESIGNED_HOST, now=EXAMPLE_NOW + 86401)
    assert err.status == 403 and "expired" in err.message
    refused("AccessDenied", "GET", PRESIGNED, PRESIGNED_HOST, now=EXAMPLE_NOW - 3600)
    # what it signs, and nothing else: another method, key or host is refused
    refused("SignatureDoesNotMatch", "PUT", PRESIGNED, PRESIGNED_HOST)
    refused("SignatureDoesNotMatch", "GET", PRESIGNED.replace("/test.txt", "/other.txt"),
            PRESIGNED_HOST)
    refused("SignatureDoesNotMatch", "GET", PRESIGNED, [("Host", "evil.example")])
    refused("SignatureDoesNotMatch", "GET", PRESIGNED.replace("Expires=86400", "Expires=86399"),
            PRESIGNED_HOST)
    refused("SignatureDoesNotMatch", "GET", PRESIGNED + "&partNumber=1", PRESIGNED_HOST)
    refused("SignatureDoesNotMatch", "GET", PRESIGNED, PRESIGNED_HOST,
            secret=SECRET.replace("K", "k"))


# The chunked examples: 66560 bytes of 'a' sent as 65536, 1024 and the final 0.
CHUNKS = [b"a" * 65536, b"a" * 1024, b""]
STREAMED = [("Host", "s3.amazonaws.com"), ("x-amz-date", EXAMPLE_DATE),
            ("x-amz-storage-class", "REDUCED_REDUNDANCY"), ("Content-Encoding", "aws-chunked"),
            ("x-amz-decoded-content-length", "66560")]


def streaming_example(trailer: bool) -> tuple[list[tuple[str, str]], list[str]]:
    if not trailer:
        mode, extra, signed_names, seed = sigv4.STREAMING_SIGNED, [("Content-Length", "66824")], \
            "content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;" \
            "x-amz-decoded-content-length;x-amz-storage-class", \
            "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
        chain = ["ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
                 "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
                 "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9"]
    else:
        mode, extra, signed_names, seed = sigv4.STREAMING_SIGNED_TRAILER, \
            [("x-amz-trailer", "x-amz-checksum-crc32c")], \
            "content-encoding;host;x-amz-content-sha256;x-amz-date;" \
            "x-amz-decoded-content-length;x-amz-storage-class;x-amz-trailer", \
            "106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e"
        chain = ["b474d8862b1487a5145d686f57f013e54db672cee1c953b3010fb58501ef5aa2",
                 "1c1344b170168f8e65b41376b44b20fe354e373826ccbbe2c1d40a8cae51e5c7",
                 "2ca2aba2005185cf7159c6277faf83795951dd77a3a99e6e65d5c9f85863f992",
                 "d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435"]
    headers = STREAMED + extra + [
        ("x-amz-content-sha256", mode),
        ("Authorization", f"AWS4-HMAC-SHA256 Credential={AKID}/20130524/us-east-1/s3/"
                          f"aws4_request, SignedHeaders={signed_names}, Signature={seed}")]
    return headers, chain


def chain_of(signed: sigv4.SignedRequest) -> sigv4.ChunkChain:
    return sigv4.ChunkChain(sigv4.signing_key(SECRET, signed.scope), signed.amz_date,
                            signed.scope, signed.signature)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("trailer", [False, True], ids=["chunks", "chunks+trailer"])
def test_aws_example_signed_chunks(trailer: bool) -> None:
    headers, signatures = streaming_example(trailer)
    signed = checked("PUT", "/examplebucket/chunkObject.txt", headers)
    assert signed.signed_chunks
    chain = chain_of(signed)
    for data, signature in zip(CHUNKS, signatures, strict=False):
        chain.chunk(sha(data), signature)
    if trailer:
        chain.trailer(b"x-amz-checksum-crc32c:sOO8/Q==\n", signatures[3])


@pytest.mark.parametrize("how", ["byte changed", "chunks reordered", "chunk dropped",
                                 "signature of another", "trailer changed"])
def test_a_changed_chunked_body_breaks_the_chain(how: str) -> None:
    headers, signatures = streaming_example(True)
    chain = chain_of(checked("PUT", "/examplebucket/chunkObject.txt", headers))
    chunks = list(zip(CHUNKS, signatures, strict=False))
    if how == "byte changed":
        chunks[1] = (b"b" + CHUNKS[1][1:], signatures[1])
    elif how == "chunks reordered":
        chunks[0], chunks[1] = chunks[1], chunks[0]
    elif how == "chunk dropped":
        del chunks[1]
    elif how == "signature of another":
        chunks[2] = (CHUNKS[2], signatures[1])
    with pytest.raises(S3Error) as info:
        for data, signature in chunks:
            chain.chunk(sha(data), signature)
        chain.trailer(b"x-amz-checksum-crc32c:AAAAAA==\n" if how == "trailer changed"
                      else b"x-amz-checksum-crc32c:sOO8/Q==\n", signatures[3])
    assert info.value.code == "SignatureDoesNotMatch"
    with pytest.raises(S3Error):            # and stays broken: nothing after it passes
        chain.chunk(sha(b""), signatures[2])


# -- botocore's signer -------------------------------------------------------------------
@pytest.fixture
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[float]:
    """botocore signs at 2013-05-24T00:00:00Z."""
    monkeypatch.setattr(botoauth, "get_current_datetime",
                        lambda *a, **k: datetime.datetime(2013, 5, 24))
    yield EXAMPLE_NOW


def boto_signed(method: str, url: str, *, body: bytes = b"", headers: dict[str, str] | None = None,
                presign: int | None = None, secret: str = SECRET, region: str = "us-east-1",
                streaming: bool = False) -> tuple[str, list[tuple[str, str]]]:
    """(raw target, headers as they go on the wire) of botocore's signed request
    (``streaming``: an upload over https with a checksum, whose payload it leaves
    unsigned)."""
    creds = Credentials(AKID, secret)
    request = AWSRequest(method=method, url=url, data=body, headers=headers or {})
    request.context["has_streaming_input"] = streaming
    if presign is not None:
        botoauth.S3SigV4QueryAuth(creds, "s3", region, expires=presign).add_auth(request)
    else:
        botoauth.S3SigV4Auth(creds, "s3", region).add_auth(request)
    prepared = request.prepare()
    parts = urlsplit(prepared.url)
    target = parts.path + ("?" + parts.query if parts.query else "")
    return target, [("Host", parts.netloc), *prepared.headers.items()]


KEYS = ["plain.txt", "dir/sub/file.bin", "with space+plus&amp=eq", "ünïcödé/ключ",
        "tilde~and!bang*paren()", "pct%41literal", "a//double/../dots/./x"]


@pytest.mark.parametrize("key", KEYS)
def test_botocore_header_signed_get_with_queries(fixed_clock: float, key: str) -> None:
    from urllib.parse import quote

    url = (f"http://127.0.0.1:9000/bucket/{quote(key, safe='/~')}"
           "?list-type=2&prefix=a%2Fb%20c&max-keys=7&empty=&flag")
    target, headers = boto_signed("GET", url, headers={"Range": "bytes=0-9"})
    signed = checked("GET", target, headers, now=fixed_clock)
    assert signed.payload_hash == sigv4.EMPTY_SHA256 and signed.scope == SCOPE


@pytest.mark.parametrize("region", ["us-east-1", "eu-central-1", "stager"])
def test_botocore_header_signed_put_with_a_payload(fixed_clock: float, region: str) -> None:
    body = b"some bytes\n" * 100
    target, headers = boto_signed(
        "PUT", "http://localhost:9000/datasets/x/y.bin", body=body, region=region,
        headers={"x-amz-meta-owner": "  ada   lovelace ", "Content-MD5": "abc",
                 "x-amz-checksum-crc32": "AAAAAA=="})
    signed = checked("PUT", target, headers, now=fixed_clock)
    assert signed.payload_hash == sha(body) and signed.scope.region == region
    # a header the signature covers, changed in transit
    changed = [(k, "bytes=1-2" if k == "x-amz-meta-owner" else v) for k, v in headers]
    refused("SignatureDoesNotMatch", "PUT", target, changed, now=fixed_clock)
    # the payload's hash is signed: a body of other bytes claims another hash
    other = [(k, sha(b"x") if k.lower() == "x-amz-content-sha256" else v) for k, v in headers]
    refused("SignatureDoesNotMatch", "PUT", target, other, now=fixed_clock)
    refused("SignatureDoesNotMatch", "PUT", target, headers, now=fixed_clock, secret="wrong")


def test_botocore_generic_sigv4_with_a_streaming_seed(fixed_clock: float) -> None:
    """botocore's generic SigV4Auth (not S3's) over a payload hash the request names, as
    an SDK signing a chunked body's seed does: accepted, and marked as signed chunks."""
    request = AWSRequest("PUT", "http://127.0.0.1:9000/b/dir/chunked.bin", headers={
        "x-amz-content-sha256": sigv4.STREAMING_SIGNED, "Content-Encoding": "aws-chunked",
        "x-amz-decoded-content-length": "66560"})
    botoauth.SigV4Auth(Credentials(AKID, SECRET), "s3", "us-east-1").add_auth(request)
    prepared = request.prepare()
    headers = [("Host", "127.0.0.1:9000"), *prepared.headers.items()]
    signed = checked("PUT", "/b/dir/chunked.bin", headers, now=fixed_clock)
    assert signed.signed_chunks and signed.payload_hash == sigv4.STREAMING_SIGNED


def test_botocore_unsigned_payload_over_https(fixed_clock: float) -> None:
    target, headers = boto_signed("PUT", "https://localhost:9000/b/k", body=b"x" * 10,
                                  headers={"Content-MD5": "dGVzdA=="}, streaming=True)
    signed = checked("PUT", target, headers, now=fixed_clock)
    assert signed.payload_hash == sigv4.UNSIGNED_PAYLOAD


@pytest.mark.parametrize("key", KEYS)
def test_botocore_presigned_urls(fixed_clock: float, key: str) -> None:
    from urllib.parse import quote

    url = f"http://127.0.0.1:9000/bucket/{quote(key, safe='/~')}?versionId=null"
    target, headers = boto_signed("GET", url, presign=3600)
    headers = [(k, v) for k, v in headers if k.lower() != "authorization"]
    signed = checked("GET", target, headers, now=fixed_clock + 3599)
    assert signed.presigned and signed.payload_hash == sigv4.UNSIGNED_PAYLOAD
    refused("AccessDenied", "GET", target, headers, now=fixed_clock + 3601)
    refused("SignatureDoesNotMatch", "DELETE", target, headers, now=fixed_clock)


def test_botocore_presigned_put(fixed_clock: float) -> None:
    target, headers = boto_signed("PUT", "http://127.0.0.1:9000/b/up.bin", presign=60)
    assert checked("PUT", target, [("Host", "127.0.0.1:9000"),
                                   ("Content-Length", "5")], now=fixed_clock).presigned


def test_clock_skew(fixed_clock: float) -> None:
    target, headers = boto_signed("GET", "http://127.0.0.1:9000/b/k")
    checked("GET", target, headers, now=fixed_clock + sigv4.MAX_SKEW)
    checked("GET", target, headers, now=fixed_clock - sigv4.MAX_SKEW)
    err = refused("RequestTimeTooSkewed", "GET", target, headers,
                  now=fixed_clock + sigv4.MAX_SKEW + 1)
    assert err.status == 403
    refused("RequestTimeTooSkewed", "GET", target, headers, now=time.time())


# -- what is not a signed request --------------------------------------------------------
def test_an_unsigned_request_is_none() -> None:
    assert sigv4.parse("GET", "/b/k?prefix=x", [("Host", "h")]) is None


def test_a_signature_version_2_url_says_so() -> None:
    """boto3 presigns with Signature V2 unless told ``signature_version='s3v4'``."""
    err = refused("InvalidRequest", "GET",
                  "/b/k?AWSAccessKeyId=AKID&Signature=c2ln&Expires=1796609054", [("Host", "h")])
    assert "AWS4-HMAC-SHA256" in err.message and err.status == 400


@pytest.mark.parametrize("authorization, code", [
    ("AWS AKID:c2lnbmF0dXJl", "InvalidRequest"),                      # Signature V2
    ("Bearer stg1.x.y", "AuthorizationHeaderMalformed"),
    ("AWS4-HMAC-SHA256", "AuthorizationHeaderMalformed"),
    ("AWS4-HMAC-SHA256 Credential=AKID/20130524/us-east-1/s3/aws4_request",
     "AuthorizationHeaderMalformed"),
    ("AWS4-HMAC-SHA256 Credential=AKID/2013/us-east-1/s3/aws4_request, SignedHeaders=host, "
     "Signature=" + "0" * 64, "AuthorizationHeaderMalformed"),
    ("AWS4-HMAC-SHA256 Credential=AKID/20130525/us-east-1/s3/aws4_request, "
     "SignedHeaders=host, Signature=" + "0" * 64, "AuthorizationHeaderMalformed"),
    ("AWS4-HMAC-SHA256 Credential=AKID/20130524/us-east-1/iam/aws4_request, "
     "SignedHeaders=host, Signature=" + "0" * 64, "AuthorizationHeaderMalformed"),
    ("AWS4-HMAC-SHA256 Credential=AKID/20130524/us-east-1/s3/aws4_request, "
     "SignedHeaders=x-amz-date, Signature=" + "0" * 64, "AuthorizationHeaderMalformed"),
    ("AWS4-HMAC-SHA256 Credential=AKID/20130524/us-east-1/s3/aws4_request, "
     "SignedHeaders=x-amz-date;host, Signature=" + "0" * 64, "AuthorizationHeaderMalformed"),
    ("AWS4-HMAC-SHA256 Credential=AKID/20130524/us-east-1/s3/aws4_request, "
     "SignedHeaders=host, Signature=zz", "SignatureDoesNotMatch"),
    ("AWS4-HMAC-SHA256 Credential=AKID/20130524/us-east-1/s3/aws4_request, "
     "SignedHeaders=host, Signature=" + "0" * 64 + ", Extra=1", "AuthorizationHeaderMalformed"),
])
def test_malformed_authorization_headers(authorization: str, code: str) -> None:
    headers = [("Host", "h"), ("x-amz-date", EXAMPLE_DATE),
               ("x-amz-content-sha256", sigv4.EMPTY_SHA256), ("Authorization", authorization)]
    err = refused(code, "GET", "/b/k", headers)
    assert 400 <= err.status < 500


@pytest.mark.parametrize("change, code", [
    (("X-Amz-Expires=86400", "X-Amz-Expires=604801"), "AuthorizationQueryParametersError"),
    (("X-Amz-Expires=86400", "X-Amz-Expires=0"), "AuthorizationQueryParametersError"),
    (("X-Amz-Expires=86400", "X-Amz-Expires=-5"), "AuthorizationQueryParametersError"),
    (("X-Amz-Expires=86400", "X-Amz-Expires=%C2%B2"), "AuthorizationQueryParametersError"),
    (("X-Amz-Algorithm=AWS4-HMAC-SHA256", "X-Amz-Algorithm=AWS4-HMAC-SHA1"),
     "AuthorizationQueryParametersError"),
    (("&X-Amz-SignedHeaders=host", ""), "AuthorizationQueryParametersError"),
    (("X-Amz-Date=20130524T000000Z", "X-Amz-Date=yesterday"),
     "AuthorizationQueryParametersError"),
    (("?X-Amz", "?X-Amz-Date=20130524T000000Z&X-Amz"), "AuthorizationQueryParametersError"),
])
def test_malformed_presigned_urls(change: tuple[str, str], code: str) -> None:
    refused(code, "GET", PRESIGNED.replace(*change), PRESIGNED_HOST)


def test_a_week_is_the_longest_presigned_url(fixed_clock: float) -> None:
    target, headers = boto_signed("GET", "http://127.0.0.1:9000/b/k", presign=sigv4.MAX_PRESIGNED)
    headers = [(k, v) for k, v in headers if k.lower() != "authorization"]
    checked("GET", target, headers, now=fixed_clock + sigv4.MAX_PRESIGNED)
    refused("AccessDenied", "GET", target, headers, now=fixed_clock + sigv4.MAX_PRESIGNED + 1)


def test_canonical_forms() -> None:
    assert sigv4.canonical_uri("/b/a%20b%7Ec~d") == "/b/a%20b~c~d"
    assert sigv4.canonical_uri("/b/%E2%82%AC+x") == "/b/%E2%82%AC%2Bx"
    assert sigv4.canonical_uri("") == "/"
    assert sigv4.canonical_query(sigv4.query_pairs("b=2&a=&c&a=1")) == "a=&a=1&b=2&c="
    assert sigv4.canonical_headers([("X-A", " one   two "), ("x-a", "three")], ("x-a",)) \
        == "x-a:one two,three\n"


# -- the authenticator of an open cluster ------------------------------------------------
@pytest.mark.parametrize("authorization", [None, "AWS4-HMAC-SHA256 garbage", "AWS k:s",
                                           "\x00\xff nonsense"])
async def test_an_open_cluster_takes_any_request(authorization: str | None) -> None:
    """Open (no --auth): any credentials, unsigned requests, even a malformed
    Authorization header, are let in as they are, never a 500."""
    from aiohttp.test_utils import make_mocked_request

    from stager.s3.auth import ANONYMOUS, Authenticator

    headers = {"Host": "h"} | ({} if authorization is None else
                               {"Authorization": authorization})
    request = make_mocked_request("PUT", "/b/k?X-Amz-Expires=bad", headers=headers)
    assert await Authenticator(required=False).authenticate(request) == ANONYMOUS


def test_a_gateway_that_checks_signatures_needs_the_metadata_server() -> None:
    from stager.s3.auth import Authenticator

    with pytest.raises(ValueError, match="metadata server"):
        Authenticator(required=True)


# -- any key, any query: what botocore signs is accepted, a change to it is not ----------
_KEY_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(key=_KEY_TEXT, query=st.dictionaries(_KEY_TEXT, st.text(max_size=20), max_size=4),
       presign=st.booleans())
def test_any_key_and_query_botocore_signs_is_accepted(key: str, query: dict[str, str],
                                                      presign: bool) -> None:
    from urllib.parse import quote, urlencode

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(botoauth, "get_current_datetime",
                   lambda *a, **k: datetime.datetime(2013, 5, 24))
        query = {k: v for k, v in query.items() if not k.startswith("X-Amz-")}
        url = f"http://127.0.0.1:9000/bucket/{quote(key, safe='/~')}"
        if query:
            url += "?" + urlencode(query, quote_via=quote)
        target, headers = boto_signed("GET", url, presign=3600 if presign else None)
        if presign:
            headers = [(k, v) for k, v in headers if k.lower() != "authorization"]
        checked("GET", target, headers, now=EXAMPLE_NOW)
        path, _, rest = target.partition("?")
        changed = path + "x" + ("?" + rest if rest else "")
        with pytest.raises(S3Error) as info:
            checked("GET", changed, headers, now=EXAMPLE_NOW)
        assert info.value.code == "SignatureDoesNotMatch"


_HEADER_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=120)


@settings(max_examples=300, deadline=None)
@given(authorization=st.one_of(st.none(), _HEADER_TEXT, st.builds(
           "AWS4-HMAC-SHA256 Credential={}, SignedHeaders={}, Signature={}".format,
           _HEADER_TEXT, _HEADER_TEXT, _HEADER_TEXT)),
       amz_date=st.one_of(st.none(), _HEADER_TEXT, st.from_regex(r"\A\d{8}T\d{6}Z\Z")),
       http_date=st.one_of(st.none(), _HEADER_TEXT, st.from_regex(
           r"\A(Mon|Fri), \d{1,2} (Jan|May) \d{1,6} \d\d:\d\d:\d\d (GMT|[+-]\d{4})\Z")),
       query=st.lists(st.tuples(st.sampled_from(["X-Amz-Algorithm", "X-Amz-Credential",
                                                 "X-Amz-Date", "X-Amz-Expires",
                                                 "X-Amz-SignedHeaders", "X-Amz-Signature",
                                                 "AWSAccessKeyId", "Signature", "x"]),
                                _HEADER_TEXT), max_size=8))
def test_whatever_a_request_claims_it_is_read_or_refused_as_s3_refuses(
        authorization: str | None, amz_date: str | None, http_date: str | None,
        query: list[tuple[str, str]]) -> None:
    """Any header or query: ``None`` (unsigned), a claim, or an :class:`S3Error`: never
    anything else (a 500)."""
    from urllib.parse import quote

    headers = [("Host", "h"), ("x-amz-content-sha256", sigv4.EMPTY_SHA256)]
    headers += [] if authorization is None else [("Authorization", authorization)]
    headers += [] if amz_date is None else [("x-amz-date", amz_date)]
    headers += [] if http_date is None else [("Date", http_date)]
    target = "/b/k?" + "&".join(f"{quote(k)}={quote(v)}" for k, v in query)
    try:
        signed = sigv4.parse("GET", target, headers)
        if signed is not None:
            sigv4.check_time(signed, EXAMPLE_NOW)
            sigv4.verify(sigv4.signing_key(SECRET, signed.scope), signed)
    except S3Error as exc:
        assert 400 <= exc.status < 500


def test_a_date_no_calendar_has_is_refused() -> None:
    headers = [("Host", "h"), ("x-amz-date", "20131399T256199Z"),
               ("x-amz-content-sha256", sigv4.EMPTY_SHA256),
               ("Authorization", "AWS4-HMAC-SHA256 Credential=AKID/20131399/us-east-1/s3/"
                                 "aws4_request, SignedHeaders=host, Signature=" + "0" * 64)]
    refused("AccessDenied", "GET", "/b/k", headers)


@pytest.mark.parametrize("date", ["Fri, 24 May 999999 00:00:00 GMT", "Fri, 24 May 1 00:00:00 GMT",
                                  "yesterday"])
def test_a_date_header_past_what_time_can_say_is_refused(date: str) -> None:
    headers = [("Host", "h"), ("Date", date), ("x-amz-content-sha256", sigv4.EMPTY_SHA256),
               ("Authorization", "AWS4-HMAC-SHA256 Credential=AKID/20130524/us-east-1/s3/"
                                 "aws4_request, SignedHeaders=date;host, Signature=" + "0" * 64)]
    with pytest.raises(S3Error) as info:          # a clean refusal, never a ValueError
        checked("GET", "/b/k", headers)
    assert 400 <= info.value.status < 500
