"""S3 keys and Signature V4 on a real ``stager up --auth --s3-port 0`` cluster.

Keys come from the CLI (``stager token create --s3``), as a user gets them; requests
from boto3 and from presigned URLs sent with urllib.  A wrong secret is
``SignatureDoesNotMatch``, an unknown key ``InvalidAccessKeyId``, an expired presigned
URL ``AccessDenied``; a read-only key cannot write; a key for ``/datasets/a`` sees
nothing beside it; a revoked token's key is refused at once by the servers and by the
gateway itself within its cache's 30 s; a signed ``aws-chunked`` body is checked
chunk by chunk.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from s3_client_util import through

from stager import Client
from stager.s3.auth import CACHE_TTL
from stager.testing.s3clients import S3Endpoint
from stager.testing.s3cluster import S3Cluster, boto3_client, error_of

pytestmark = pytest.mark.slow      # stager up as a subprocess, the CLI as subprocesses


@dataclass(frozen=True)
class Key:
    access: str
    secret: str
    token_id: str


@dataclass(frozen=True)
class Aging:
    """Keys made as the module's cluster starts, for its last test: the 30 s of the
    gateway's cache and of the servers' clock skew pass under the other tests."""
    expiring: Key           # a 1 s token's
    born: float             # time.monotonic() just after it was made
    cached: Key             # used once through the gateway then: its answer is cached


class World:
    def __init__(self, s3: S3Cluster) -> None:
        self.s3 = s3
        self.admin_file = str(s3.cluster.info["admin_token_file"])
        self.aging: Aging | None = None

    def stager(self, *argv: str) -> str:
        """A ``stager`` command as the admin; its stdout (it must succeed)."""
        done = subprocess.run([sys.executable, "-m", "stager", "--meta", self.s3.meta_url,
                               "--token-file", self.admin_file, *argv],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def key(self, *scopes: str, prefix: str = "/", ttl: str = "1h") -> Key:
        out = self.stager("token", "create", "--s3", *(a for s in scopes for a in ("--scope", s)),
                          "--prefix", prefix, "--ttl", ttl, "--name", f"s3 {prefix}")
        access, secret = out.splitlines()[-1].split()
        token_id = re.match(r"token ([0-9a-f]{32}) ", out).group(1)     # type: ignore[union-attr]
        return Key(access, secret, token_id)

    def boto(self, key: Key, secret: str | None = None) -> Any:
        # s3v4: boto3 presigns with Signature V2 otherwise (refused, saying so)
        return boto3_client(self.s3.url, access_key=key.access,
                            secret_key=key.secret if secret is None else secret,
                            signature_version="s3v4")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with S3Cluster(tmp_path_factory.mktemp("s3-auth"), auth=True) as s3:
        w = World(s3)
        expiring = w.key("read", prefix="/datasets", ttl="1s")
        w.aging = Aging(expiring, time.monotonic(), w.key("read", prefix="/datasets"))
        admin = w.boto(w.key("admin"))
        admin.create_bucket(Bucket="datasets")
        for name in ("a/x.bin", "a/sub/y.bin", "b/z.bin", "top.bin"):
            admin.put_object(Bucket="datasets", Key=name, Body=name.encode() * 10)
        assert w.boto(w.aging.cached).get_object(Bucket="datasets", Key="top.bin")
        yield w


def refused(fn: Any, *args: Any, **kwargs: Any) -> tuple[int, str]:
    with pytest.raises(ClientError) as info:
        fn(*args, **kwargs)
    code, status = error_of(info)       # (status, code) here, as a request's outcome
    return status, code


def http(method: str, url: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def xml_code(body: bytes) -> str:
    found = re.search(rb"<Code>([^<]+)</Code>", body)
    return found.group(1).decode() if found else ""


def test_the_cli_prints_the_key_last_and_lists_it(world: World) -> None:
    key = world.key("read", prefix="/datasets/a")
    assert re.fullmatch(r"STG[0-9A-Z]{17}", key.access) and len(key.secret) == 40
    line = next(ln for ln in world.stager("token", "list").splitlines()
                if ln.startswith(key.token_id))
    assert f"s3:{key.access}" in line and "/datasets/a" in line
    # the secret is nowhere at rest: the store keeps it sealed
    for path in world.s3.cluster_dir.rglob("*"):
        if path.is_file() and path.stat().st_size < 64 << 20:
            assert key.secret.encode() not in path.read_bytes(), path


def test_a_good_key_reads_and_a_wrong_secret_or_key_is_refused(world: World) -> None:
    key = world.key("read", prefix="/datasets")
    got = world.boto(key).get_object(Bucket="datasets", Key="a/x.bin")["Body"].read()
    assert got == b"a/x.bin" * 10
    wrong = key.secret[:-1] + ("y" if key.secret.endswith("x") else "x")   # never the same
    assert refused(world.boto(key, secret=wrong).get_object,
                   Bucket="datasets", Key="a/x.bin") == (403, "SignatureDoesNotMatch")
    stranger = Key("STG" + "Q" * 17, key.secret, "")
    assert refused(world.boto(stranger).get_object, Bucket="datasets", Key="a/x.bin") == \
        (403, "InvalidAccessKeyId")


def test_unsigned_and_malformed_requests_are_refused(world: World) -> None:
    status, body = http("GET", f"{world.s3.url}/datasets/a/x.bin")
    assert (status, xml_code(body)) == (403, "AccessDenied")
    status, body = http("GET", f"{world.s3.url}/datasets/a/x.bin",
                        headers={"Authorization": "AWS4-HMAC-SHA256 garbage"})
    assert status == 400 and xml_code(body) == "AuthorizationHeaderMalformed"


def test_a_read_only_key_cannot_write(world: World) -> None:
    reader = world.boto(world.key("read", prefix="/datasets"))
    assert refused(reader.put_object, Bucket="datasets", Key="a/new.bin", Body=b"x") == \
        (403, "AccessDenied")
    assert refused(reader.delete_object, Bucket="datasets", Key="a/x.bin")[0] == 403
    with Client(world.s3.meta_url, token=Path(world.admin_file).read_text().strip()) as c:
        assert not c.exists("/datasets/a/new.bin") and c.exists("/datasets/a/x.bin")


def test_a_key_for_a_prefix_lists_only_what_it_may_see(world: World) -> None:
    c = world.boto(world.key("read", prefix="/datasets/a"))
    listed = c.list_objects_v2(Bucket="datasets")
    assert sorted(o["Key"] for o in listed.get("Contents", [])) == ["a/sub/y.bin", "a/x.bin"]
    assert refused(c.get_object, Bucket="datasets", Key="b/z.bin")[0] == 403
    assert c.get_object(Bucket="datasets", Key="a/sub/y.bin")["Body"].read() == \
        b"a/sub/y.bin" * 10


def test_presigned_get_and_put_and_their_expiry(world: World) -> None:
    rw = world.boto(world.key("read", "write", prefix="/datasets/p"))
    put = rw.generate_presigned_url("put_object", Params={"Bucket": "datasets",
                                                          "Key": "p/up.bin"}, ExpiresIn=300)
    assert http("PUT", put, b"presigned bytes") == (200, b"")
    get = rw.generate_presigned_url("get_object", Params={"Bucket": "datasets",
                                                          "Key": "p/up.bin"}, ExpiresIn=300)
    assert http("GET", get) == (200, b"presigned bytes")
    # the URL is for that request alone: another method or key is refused
    status, body = http("DELETE", get)
    assert (status, xml_code(body)) == (403, "SignatureDoesNotMatch")
    other = get.replace("/p/up.bin?", "/p/other.bin?")
    assert xml_code(http("GET", other)[1]) == "SignatureDoesNotMatch"
    v2 = boto3_client(world.s3.url, access_key="k", secret_key="s").generate_presigned_url(
        "get_object", Params={"Bucket": "datasets", "Key": "p/up.bin"})
    status, body = http("GET", v2)
    assert (status, xml_code(body)) == (400, "InvalidRequest") and b"AWS4-HMAC-SHA256" in body
    short = rw.generate_presigned_url("get_object", Params={"Bucket": "datasets",
                                                            "Key": "p/up.bin"}, ExpiresIn=1)
    time.sleep(2.1)
    status, body = http("GET", short)
    assert (status, xml_code(body)) == (403, "AccessDenied")
    assert b"expired" in body


def test_a_key_for_a_prefix_writes_an_object_with_attributes(world: World) -> None:
    """The attributes are the file version's, committed with it: whatever a key may
    write and read of a file it may of them (no record outside its prefix)."""
    rw = world.boto(world.key("read", "write", prefix="/datasets/m"))
    rw.put_object(Bucket="datasets", Key="m/typed.json", Body=b"{}",
                  ContentType="application/json", Metadata={"owner": "ada"})
    head = rw.head_object(Bucket="datasets", Key="m/typed.json")
    assert (head["ContentType"], head["Metadata"]) == ("application/json", {"owner": "ada"})
    listed = rw.list_objects_v2(Bucket="datasets", Prefix="m/")["Contents"]
    assert [o["ETag"] for o in listed] == [f'"{hashlib.md5(b"{}").hexdigest()}"']


def test_boto3_with_default_checksums_and_multipart(world: World) -> None:
    rw = world.boto(world.key("read", "write", prefix="/datasets/w"))
    rw.put_object(Bucket="datasets", Key="w/one.bin", Body=b"1" * 100_000)
    assert rw.head_object(Bucket="datasets", Key="w/one.bin")["ContentLength"] == 100_000
    data = bytes(range(256)) * (40 * 4096)              # 10 MiB: multipart in boto3
    rw.upload_fileobj(io.BytesIO(data), "datasets", "w/big.bin")
    out = io.BytesIO()
    rw.download_fileobj("datasets", "w/big.bin", out)
    assert out.getvalue() == data


def signed_chunked_put(url: str, key: Key, chunks: list[bytes], *,
                       tamper: int | None = None, trailer: bytes | None = None,
                       trailer_signature: bool = True) -> tuple[int, bytes]:
    """A PUT whose body is ``aws-chunked`` with a signature on every chunk
    (``STREAMING-AWS4-HMAC-SHA256-PAYLOAD``, or ``…-TRAILER`` with ``trailer``, a
    trailing header line), as the Java and Go SDKs send over http: the seed signed by
    botocore, the chain computed here from the SigV4 spec."""
    total = sum(len(c) for c in chunks)
    mode = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD" + ("-TRAILER" if trailer else "")
    extra = {"x-amz-trailer": trailer.split(b":")[0].decode()} if trailer else {}
    request = AWSRequest("PUT", url, headers={
        "x-amz-content-sha256": mode, "Content-Encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(total), **extra})
    SigV4Auth(Credentials(key.access, key.secret), "s3", "us-east-1").add_auth(request)
    headers = dict(request.headers.items())
    amz_date = headers["X-Amz-Date"]
    scope = f"{amz_date[:8]}/us-east-1/s3/aws4_request"
    signing = ("AWS4" + key.secret).encode()
    for part in (amz_date[:8], "us-east-1", "s3", "aws4_request"):
        signing = hmac.new(signing, part.encode(), hashlib.sha256).digest()

    def sign(*lines: str) -> str:
        return hmac.new(signing, "\n".join(lines).encode(), hashlib.sha256).hexdigest()

    previous = headers["Authorization"].rsplit("Signature=", 1)[1]
    body = b""
    for i, chunk in enumerate([*chunks, b""]):
        previous = sign("AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, previous,
                        hashlib.sha256(b"").hexdigest(), hashlib.sha256(chunk).hexdigest())
        sent = chunk[:-1] + b"!" if i == tamper else chunk
        body += f"{len(chunk):x};chunk-signature={previous}\r\n".encode() + sent
        body += b"\r\n" if chunk else b""
    if trailer:
        signature = sign("AWS4-HMAC-SHA256-TRAILER", amz_date, scope, previous,
                         hashlib.sha256(trailer + b"\n").hexdigest())
        sent_trailer = trailer if tamper != -1 else trailer[:-3] + b"AA="
        body += sent_trailer + b"\r\n"
        if trailer_signature:
            body += f"x-amz-trailer-signature:{signature}\r\n".encode()
    return http("PUT", url, body + b"\r\n", headers)


def crc32_line(data: bytes) -> bytes:
    import base64
    import zlib

    return b"x-amz-checksum-crc32:" + base64.b64encode(zlib.crc32(data).to_bytes(4, "big"))


def test_a_signed_chunked_body_is_checked_chunk_by_chunk(world: World) -> None:
    key = world.key("read", "write", prefix="/datasets/c")
    chunks = [b"a" * 65536, b"b" * 1000]
    status, body = signed_chunked_put(f"{world.s3.url}/datasets/c/signed.bin", key, chunks)
    assert status == 200, body
    got = world.boto(key).get_object(Bucket="datasets", Key="c/signed.bin")["Body"].read()
    assert got == b"".join(chunks)
    status, body = signed_chunked_put(f"{world.s3.url}/datasets/c/tampered.bin", key, chunks,
                                      tamper=1)
    assert (status, xml_code(body)) == (403, "SignatureDoesNotMatch")
    assert refused(world.boto(key).head_object, Bucket="datasets", Key="c/tampered.bin")[0] \
        == 404                                          # nothing of it is visible
    # with a signed trailer (its CRC32 checked too); a changed trailer breaks the chain
    trailer = crc32_line(b"".join(chunks))
    status, body = signed_chunked_put(f"{world.s3.url}/datasets/c/trailed.bin", key, chunks,
                                      trailer=trailer)
    assert status == 200, body
    got = world.boto(key).get_object(Bucket="datasets", Key="c/trailed.bin", ChecksumMode="ENABLED")
    assert got["Body"].read() == b"".join(chunks)
    status, body = signed_chunked_put(f"{world.s3.url}/datasets/c/trailer-changed.bin", key,
                                      chunks, trailer=trailer, tamper=-1)
    assert (status, xml_code(body)) == (403, "SignatureDoesNotMatch")


def test_a_signed_trailer_without_its_signature_is_refused(world: World) -> None:
    key = world.key("read", "write")
    chunks = [b"t" * 5000]
    status, body = signed_chunked_put(f"{world.s3.url}/datasets/c/unsigned-trailer.bin", key,
                                      chunks, trailer=crc32_line(chunks[0]),
                                      trailer_signature=False)
    assert (status, xml_code(body)) == (403, "SignatureDoesNotMatch")


@pytest.fixture
def lone_gateway(world: World, tmp_path: Path) -> Iterator[str]:
    """``stager s3 --auth`` beside the cluster, started afresh (nothing cached): its
    credential from ``token create --scope s3gateway --out``, given with
    ``--token-file``.  Its URL."""
    import json
    import signal

    world.stager("token", "create", "--scope", "s3gateway", "--name", "gateway",
                 "--out", str(tmp_path / "gw.token"))
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "stager", "--meta", world.s3.meta_url,
                             "--token-file", str(tmp_path / "gw.token"), "s3", "--auth",
                             "--port", "0", "--ready-file", str(ready)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        yield json.loads(ready.read_text())["url"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def test_a_gateway_run_alone_with_its_own_credential(world: World, lone_gateway: str) -> None:
    key = world.key("read")
    c = boto3_client(lone_gateway, access_key=key.access, secret_key=key.secret)
    assert c.get_object(Bucket="datasets", Key="top.bin")["Body"].read() == b"top.bin" * 10
    wrong = boto3_client(lone_gateway, access_key=key.access, secret_key="x" * 40)
    assert refused(wrong.get_object, Bucket="datasets", Key="top.bin") == \
        (403, "SignatureDoesNotMatch")


def test_a_key_for_a_prefix_reads_on_a_fresh_gateway(world: World, lone_gateway: str) -> None:
    key = world.key("read", prefix="/datasets")
    c = boto3_client(lone_gateway, access_key=key.access, secret_key=key.secret)
    assert c.get_object(Bucket="datasets", Key="top.bin")["Body"].read() == b"top.bin" * 10


@pytest.mark.parametrize("credential", ["read", "none"])
async def test_a_gateway_whose_own_credential_is_refused_says_so(world: World,
                                                                 credential: str) -> None:
    """The gateway's fault, not the client's: 503 ServiceUnavailable, never a missing key
    or object (the operator reads why in the gateway's log)."""
    from stager.config import load_config
    from stager.s3.auth import Authenticator
    from stager.s3.errors import S3Error

    token = world.s3.cluster.mint(["read"]) if credential == "read" else ""
    auth = Authenticator(required=True, meta_url=world.s3.meta_url,
                         config=load_config({"token": token}, env={}))
    try:
        with pytest.raises(S3Error) as info:
            await auth.authenticate(mocked_signed(world.key("read"), "/datasets/top.bin"))
    finally:
        await auth.close()
    assert (info.value.code, info.value.status) == ("ServiceUnavailable", 503)


def mocked_signed(key: Key, path: str) -> Any:
    """An aiohttp request for ``path``, signed by botocore with ``key``."""
    from aiohttp.test_utils import make_mocked_request

    request = AWSRequest("GET", f"http://127.0.0.1:9000{path}")
    S3SigV4Auth(Credentials(key.access, key.secret), "s3", "us-east-1").add_auth(request)
    return make_mocked_request("GET", path, headers={"Host": "127.0.0.1:9000",
                                                     **dict(request.headers.items())})


async def test_requests_arriving_together_ask_once_and_bad_keys_are_remembered(
        world: World) -> None:
    import asyncio

    from stager.config import load_config
    from stager.s3.auth import Authenticator
    from stager.s3.errors import S3Error

    gateway = world.s3.cluster.mint(["s3gateway"], name="gw test")
    auth = Authenticator(required=True, meta_url=world.s3.meta_url,
                         config=load_config({"token": gateway}, env={}))
    key = world.key("read")
    try:
        got = await asyncio.gather(*(auth.authenticate(mocked_signed(key, f"/datasets/{i}"))
                                     for i in range(20)))
        assert {p.access_key for p in got} == {key.access} and auth.asked == 1
        stranger = Key("STG" + "Z" * 17, key.secret, "")
        for i in range(10):
            with pytest.raises(S3Error) as info:
                await auth.authenticate(mocked_signed(stranger, f"/datasets/{i}"))
            assert info.value.code == "InvalidAccessKeyId"
        assert auth.asked == 2                  # the unknown key was asked about once
        auth.forget()
        await auth.authenticate(mocked_signed(key, "/datasets/x"))
        assert auth.asked == 3
    finally:
        await auth.close()


# -- every client's signer ----------------------------------------------------------------
CLIENTS = ["s3fs", "pyarrow", "polars", "duckdb", "awscli", "rclone"]


@pytest.mark.parametrize("client", CLIENTS)
def test_every_clients_signatures_are_accepted_and_a_wrong_secret_is_not(
        world: World, client: str, tmp_path: Path) -> None:
    key = world.key("read", "write")
    good = S3Endpoint(world.s3.url, key.access, key.secret)
    through(client, good, f"clients/{client}", tmp_path / "good")
    with Client(world.s3.meta_url, token=Path(world.admin_file).read_text().strip()) as c:
        assert c.cat(f"/datasets/clients/{client}/t.parquet")[:4] == b"PAR1"
    bad = S3Endpoint(world.s3.url, key.access, key.secret[::-1])
    with pytest.raises(Exception) as refused_info:      # each client says so its own way
        through(client, bad, f"clients/{client}-bad", tmp_path / "bad")
    said = str(refused_info.value)
    assert re.search(r"(?i)signature.{0,40}does.?not.?match|\b403\b|forbidden|denied", said), \
        said[-2000:]
    with Client(world.s3.meta_url, token=Path(world.admin_file).read_text().strip()) as c:
        assert not c.exists(f"/datasets/clients/{client}-bad")


# -- last, so that its waits have mostly passed (module order: pytest, and make test's
# xdist groups, run a module's tests in file order on one worker) -----------------------
def test_a_revoked_and_an_expired_tokens_key_are_refused(world: World) -> None:
    aging = world.aging
    assert aging is not None
    key = world.key("read", prefix="/datasets")
    c = world.boto(key)
    assert c.get_object(Bucket="datasets", Key="top.bin")["Body"].read() == b"top.bin" * 10
    world.stager("token", "revoke", key.token_id)
    # at once: the gateway still knows the key, but the servers refuse its token
    assert refused(c.get_object, Bucket="datasets", Key="top.bin")[0] == 403
    # ... and the gateway itself, once its answer is older than its cache's TTL (the
    # cached key's answer is as old as the module)
    world.stager("token", "revoke", aging.cached.token_id)
    c = world.boto(aging.cached)
    deadline = time.monotonic() + CACHE_TTL + 10
    while True:
        status, code = refused(c.get_object, Bucket="datasets", Key="top.bin")
        if code == "InvalidAccessKeyId" or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert (status, code) == (403, "InvalidAccessKeyId")
    # past its expiry and the servers' 30 s of clock skew
    time.sleep(max(0.0, aging.born + 32 - time.monotonic()))
    assert refused(world.boto(aging.expiring).get_object, Bucket="datasets",
                   Key="top.bin") == (403, "InvalidAccessKeyId")
