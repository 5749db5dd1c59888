"""S3 multipart uploads through boto3 against ``stager up --s3-port``: create, parts,
complete, abort, the listings, UploadPartCopy and S3's errors; bytes read back through
S3 and through ``stager://`` byte-exact, and aligned parts committed without a copy."""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from stager.client import Client
from stager.config import load_config
from stager.testing.s3cluster import S3Cluster, boto3_client
from stager.testing.s3cluster import error_of as err

pytestmark = [pytest.mark.slow]
MiB = 1 << 20
MIN_PART = 64 << 10          # the cluster's multipart_min_part: small parts in tests


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Cluster]:
    env = {"STAGER_MULTIPART_MIN_PART": str(MIN_PART)}
    with S3Cluster(tmp_path_factory.mktemp("s3mp"), data_servers=2, env=env) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def c(s3: S3Cluster) -> Any:
    return boto3_client(s3.url)


@pytest.fixture(scope="module")
def sc(s3: S3Cluster) -> Iterator[Client]:
    client = Client(s3.meta_url, config=load_config(env={}))
    yield client
    client.close()


@pytest.fixture(scope="module")
def bucket(c: Any) -> str:
    c.create_bucket(Bucket="mpu")
    return "mpu"


def data_of(size: int, seed: int = 1) -> bytes:
    block = hashlib.sha256(str(seed).encode()).digest() * 2048      # 64 KiB
    return (block * (size // len(block) + 1))[:size]


def multipart_etag(parts: list[bytes]) -> str:
    joined = b"".join(hashlib.md5(p, usedforsecurity=False).digest() for p in parts)
    return f'"{hashlib.md5(joined, usedforsecurity=False).hexdigest()}-{len(parts)}"'


def test_upload_fileobj_of_40_mb_in_8_mib_parts(c: Any, sc: Client, bucket: str) -> None:
    data = data_of(40 * 1000 * 1000)
    config = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB,
                            max_concurrency=4)
    c.upload_fileobj(io.BytesIO(data), bucket, "big/forty.bin", Config=config)
    head = c.head_object(Bucket=bucket, Key="big/forty.bin")
    parts = [data[i:i + 8 * MiB] for i in range(0, len(data), 8 * MiB)]
    assert head["ContentLength"] == len(data) and head["ETag"] == multipart_etag(parts)
    got = io.BytesIO()
    c.download_fileobj(bucket, "big/forty.bin", got)
    assert got.getvalue() == data
    assert sc.cat("/mpu/big/forty.bin") == data
    # partNumber=N reads back part N
    second = c.get_object(Bucket=bucket, Key="big/forty.bin", PartNumber=2)
    assert second["Body"].read() == parts[1]
    assert c.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_create_parts_complete_without_a_copy(s3: S3Cluster, c: Any, sc: Client,
                                              bucket: str) -> None:
    parts = [data_of(4 * MiB, 1), data_of(4 * MiB, 2), data_of(1000, 3)]
    up = c.create_multipart_upload(Bucket=bucket, Key="k/three", ContentType="text/x-test",
                                   Metadata={"who": "me"})
    uid = up["UploadId"]
    etags = [c.upload_part(Bucket=bucket, Key="k/three", UploadId=uid, PartNumber=n,
                           Body=p)["ETag"] for n, p in enumerate(parts, 1)]
    # invisible until completed
    with pytest.raises(ClientError) as exc:
        c.head_object(Bucket=bucket, Key="k/three")
    assert err(exc)[1] == 404
    assert "k/three" not in [o["Key"] for o in c.list_objects_v2(Bucket=bucket)
                             .get("Contents", [])]
    # the pending file the parts were written into (the metadata server's record)
    with urllib.request.urlopen(f"{s3.meta_url}/v1/multipart?prefix=/mpu/k/", timeout=10) as r:
        [pending] = json.loads(r.read())["uploads"]
    listed = c.list_parts(Bucket=bucket, Key="k/three", UploadId=uid)
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in listed["Parts"]] == [
        (n, len(p), e) for n, (p, e) in enumerate(zip(parts, etags, strict=True), 1)]
    uploads = c.list_multipart_uploads(Bucket=bucket, Prefix="k/")["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in uploads] == [("k/three", uid)]
    done = c.complete_multipart_upload(
        Bucket=bucket, Key="k/three", UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e}
                                   for n, e in enumerate(etags, 1)]})
    assert done["ETag"] == multipart_etag(parts)
    head = c.head_object(Bucket=bucket, Key="k/three")
    assert head["ETag"] == multipart_etag(parts) and head["ContentType"] == "text/x-test"
    assert head["Metadata"] == {"who": "me"}
    assert c.get_object(Bucket=bucket, Key="k/three")["Body"].read() == b"".join(parts)
    assert sc.cat("/mpu/k/three") == b"".join(parts)
    # no copy: the object is that pending file, whose chunks the parts were written as
    assert sc.stat("/mpu/k/three").file_id == pending["file_id"]
    # the completion sent again (its answer lost, say): the same answer, nothing changed
    again = c.complete_multipart_upload(
        Bucket=bucket, Key="k/three", UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e}
                                   for n, e in enumerate(etags, 1)]})
    assert again["ETag"] == done["ETag"]
    assert sc.stat("/mpu/k/three").file_id == pending["file_id"]
    with pytest.raises(ClientError) as exc:        # another part list: no such upload
        c.complete_multipart_upload(Bucket=bucket, Key="k/three", UploadId=uid,
                                    MultipartUpload={"Parts": [{"PartNumber": 1,
                                                                "ETag": etags[0]}]})
    assert err(exc) == ("NoSuchUpload", 404)


def test_abort_leaves_nothing(c: Any, sc: Client, bucket: str) -> None:
    uid = c.create_multipart_upload(Bucket=bucket, Key="gone/x")["UploadId"]
    c.upload_part(Bucket=bucket, Key="gone/x", UploadId=uid, PartNumber=1,
                  Body=data_of(MIN_PART))
    c.abort_multipart_upload(Bucket=bucket, Key="gone/x", UploadId=uid)
    with pytest.raises(ClientError) as exc:
        c.list_parts(Bucket=bucket, Key="gone/x", UploadId=uid)
    assert err(exc) == ("NoSuchUpload", 404)
    with pytest.raises(ClientError) as exc:
        c.upload_part(Bucket=bucket, Key="gone/x", UploadId=uid, PartNumber=2, Body=b"x")
    assert err(exc) == ("NoSuchUpload", 404)
    with pytest.raises(ClientError) as exc:
        c.head_object(Bucket=bucket, Key="gone/x")
    assert err(exc)[1] == 404
    assert not sc.exists("/mpu/gone/x")


def test_upload_part_copy(c: Any, sc: Client, bucket: str) -> None:
    source = data_of(3 * MIN_PART + 17, 7)
    c.put_object(Bucket=bucket, Key="src/whole", Body=source)
    uid = c.create_multipart_upload(Bucket=bucket, Key="copy/dst")["UploadId"]
    a = c.upload_part_copy(Bucket=bucket, Key="copy/dst", UploadId=uid, PartNumber=1,
                           CopySource={"Bucket": bucket, "Key": "src/whole"},
                           CopySourceRange=f"bytes={MIN_PART}-{2 * MIN_PART - 1}")
    b = c.upload_part_copy(Bucket=bucket, Key="copy/dst", UploadId=uid, PartNumber=2,
                           CopySource=f"{bucket}/src/whole")
    with pytest.raises(ClientError) as exc:
        c.upload_part_copy(Bucket=bucket, Key="copy/dst", UploadId=uid, PartNumber=3,
                           CopySource=f"{bucket}/src/whole",
                           CopySourceRange=f"bytes=0-{len(source)}")
    assert err(exc) == ("InvalidRange", 416)
    etags = [a["CopyPartResult"]["ETag"], b["CopyPartResult"]["ETag"]]
    c.complete_multipart_upload(Bucket=bucket, Key="copy/dst", UploadId=uid,
                                MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e}
                                                           for n, e in enumerate(etags, 1)]})
    want = source[MIN_PART:2 * MIN_PART] + source
    assert c.get_object(Bucket=bucket, Key="copy/dst")["Body"].read() == want
    assert sc.cat("/mpu/copy/dst") == want


def test_completion_errors(c: Any, sc: Client, bucket: str) -> None:
    key = "err/obj"
    uid = c.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    small, big = data_of(1000, 1), data_of(MIN_PART, 2)
    e1 = c.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=1, Body=small)["ETag"]
    e2 = c.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=2, Body=big)["ETag"]

    def complete(parts: list[dict[str, Any]]) -> tuple[str, int]:
        with pytest.raises(ClientError) as exc:
            c.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid,
                                        MultipartUpload={"Parts": parts})
        return err(exc)

    assert complete([{"PartNumber": 2, "ETag": e2}, {"PartNumber": 1, "ETag": e1}]) == \
        ("InvalidPartOrder", 400)
    assert complete([{"PartNumber": 1, "ETag": e1}, {"PartNumber": 3, "ETag": e2}]) == \
        ("InvalidPart", 400)
    assert complete([{"PartNumber": 1, "ETag": e2}]) == ("InvalidPart", 400)
    assert complete([{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]) == \
        ("EntityTooSmall", 400)
    with pytest.raises(ClientError) as exc:
        c.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=10001, Body=b"x")
    assert err(exc) == ("InvalidArgument", 400)
    with pytest.raises(ClientError) as exc:
        c.list_parts(Bucket=bucket, Key="err/other", UploadId=uid)     # another key's
    assert err(exc) == ("NoSuchUpload", 404)
    assert not sc.exists("/mpu/err/obj")          # nothing half-visible after all that
    c.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid,
                                MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": e2}]})
    assert sc.cat("/mpu/err/obj") == big


def test_malformed_completion_xml(s3: S3Cluster, c: Any, bucket: str) -> None:
    uid = c.create_multipart_upload(Bucket=bucket, Key="xml/obj")["UploadId"]
    for body in (b"<CompleteMultipartUpload><Part>", b"<Nope/>",
                 b"<CompleteMultipartUpload><Part><PartNumber>x</PartNumber>"
                 b"<ETag>e</ETag></Part></CompleteMultipartUpload>",
                 b"<CompleteMultipartUpload></CompleteMultipartUpload>",
                 b'<!DOCTYPE a [<!ENTITY b "c">]><CompleteMultipartUpload/>'):
        request = urllib.request.Request(f"{s3.url}/{bucket}/xml/obj?uploadId={uid}",
                                         data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(request, timeout=10)
        assert exc.value.code == 400 and b"<Code>MalformedXML</Code>" in exc.value.read()
    c.abort_multipart_upload(Bucket=bucket, Key="xml/obj", UploadId=uid)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def test_a_large_part_streams_in_bounded_memory(s3: S3Cluster, c: Any, sc: Client,
                                                bucket: str, tmp_path: Path) -> None:
    """One 256 MiB part, sent as a file: the gateway holds a few chunks of it at a time,
    never the part."""
    size = 256 * MiB
    src = tmp_path / "part"
    with open(src, "wb") as f:
        for i in range(size // (8 * MiB)):
            f.write(data_of(8 * MiB, i))
    pid = int(s3.cluster.info["s3"]["pid"])
    uid = c.create_multipart_upload(Bucket=bucket, Key="mem/one")["UploadId"]
    before = _rss(pid)
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss(pid))
            time.sleep(0.01)

    watcher = threading.Thread(target=sample)
    watcher.start()
    try:
        with open(src, "rb") as body:
            etag = c.upload_part(Bucket=bucket, Key="mem/one", UploadId=uid, PartNumber=1,
                                 Body=body)["ETag"]
    finally:
        done.set()
        watcher.join()
    c.complete_multipart_upload(Bucket=bucket, Key="mem/one", UploadId=uid,
                                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert sc.stat("/mpu/mem/one").size == size
    with open(src, "rb") as f:
        assert sc.cat("/mpu/mem/one", 100 * MiB, 101 * MiB) == f.read()[100 * MiB:101 * MiB]
    print(f"s3 gateway RSS during a {size >> 20} MiB part: {before >> 20} MiB before, "
          f"{peak[0] >> 20} MiB at most")
    assert peak[0] - before < 128 * MiB, (before, peak[0])


def test_bad_multipart_requests_are_s3_errors_never_a_5xx(s3: S3Cluster, c: Any, sc: Client,
                                                          bucket: str) -> None:
    uid = c.create_multipart_upload(Bucket=bucket, Key="bad/obj")["UploadId"]
    other = "0" * 32
    cases = [
        ("PUT", f"bad/obj?partNumber=0&uploadId={uid}", b"x", "InvalidArgument"),
        ("PUT", f"bad/obj?partNumber=abc&uploadId={uid}", b"x", "InvalidArgument"),
        ("PUT", f"bad/obj?partNumber=99999999999999999999&uploadId={uid}", b"x",
         "InvalidArgument"),
        ("PUT", "bad/obj?partNumber=1&uploadId=not-an-id", b"x", "NoSuchUpload"),
        ("PUT", f"bad/obj?partNumber=1&uploadId={other}", b"x", "NoSuchUpload"),
        ("POST", f"bad/obj?uploadId={other}", b"<CompleteMultipartUpload><Part>"
         b"<PartNumber>1</PartNumber><ETag>x</ETag></Part></CompleteMultipartUpload>",
         "NoSuchUpload"),
        ("POST", f"bad/obj?uploadId={uid}", b"<CompleteMultipartUpload><Part><PartNumber>"
         b"10001</PartNumber><ETag>x</ETag></Part></CompleteMultipartUpload>",
         "InvalidArgument"),
        ("POST", f"bad/obj?uploadId={uid}", b"<CompleteMultipartUpload><Part><PartNumber>"
         b"1</PartNumber><ETag>\"nothex\"</ETag></Part></CompleteMultipartUpload>",
         "InvalidPart"),
        ("GET", f"bad/obj?uploadId={uid}&max-parts=-1", None, "InvalidArgument"),
        ("GET", "?uploads&max-uploads=x", None, "InvalidArgument"),
        ("DELETE", f"bad/obj?uploadId={other}", None, "NoSuchUpload"),
        ("POST", "bad/?uploads", None, "InvalidArgument"),
        ("POST", "nobucket/k?uploads", None, "NoSuchBucket"),
    ]
    # a part over S3's 5 GiB, refused from its headers before any byte is read
    huge = http.client.HTTPConnection(s3.url.split("://", 1)[1], timeout=10)
    huge.putrequest("PUT", f"/{bucket}/bad/obj?partNumber=1&uploadId={uid}")
    huge.putheader("Content-Length", str((5 << 30) + 1))
    huge.endheaders()
    reply = huge.getresponse()
    assert reply.status == 400 and b"<Code>EntityTooLarge</Code>" in reply.read()
    huge.close()
    for method, target, body, code in cases:
        url = f"{s3.url}/{target}" if target.startswith("nobucket") \
            else f"{s3.url}/{bucket}/{target}" if not target.startswith("?") \
            else f"{s3.url}/{bucket}{target}"
        request = urllib.request.Request(url, data=body, method=method)
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(request, timeout=10)
        answer = exc.value.read()
        assert exc.value.code < 500 and f"<Code>{code}</Code>".encode() in answer, \
            (method, target, exc.value.code, answer[:300])
    assert not sc.exists("/mpu/bad/obj")
    c.abort_multipart_upload(Bucket=bucket, Key="bad/obj", UploadId=uid)


def test_listings_page_with_markers(c: Any, bucket: str) -> None:
    keys = ["pg/a", "pg/b", "pg/b", "pg/d/x", "pg/d/y"]          # two uploads of pg/b
    made = [(k, c.create_multipart_upload(Bucket=bucket, Key=k)["UploadId"]) for k in keys]
    want = sorted(made)
    seen, kw = [], {}
    for _ in range(5):
        page = c.list_multipart_uploads(Bucket=bucket, Prefix="pg/", MaxUploads=2, **kw)
        seen += [(u["Key"], u["UploadId"]) for u in page.get("Uploads", [])]
        if not page["IsTruncated"]:
            break
        kw = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}
    assert seen == want
    # a key marker alone skips every upload of that key
    after_b = c.list_multipart_uploads(Bucket=bucket, Prefix="pg/", KeyMarker="pg/b")
    assert [u["Key"] for u in after_b["Uploads"]] == ["pg/d/x", "pg/d/y"]
    folded = c.list_multipart_uploads(Bucket=bucket, Prefix="pg/", Delimiter="/")
    assert [u["Key"] for u in folded["Uploads"]] == ["pg/a", "pg/b", "pg/b"]
    assert [p["Prefix"] for p in folded["CommonPrefixes"]] == ["pg/d/"]
    # ListParts pages too
    key, uid = made[0]
    for n in (1, 2, 3):
        c.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=n, Body=b"p" * n)
    first = c.list_parts(Bucket=bucket, Key=key, UploadId=uid, MaxParts=2)
    assert [p["PartNumber"] for p in first["Parts"]] == [1, 2] and first["IsTruncated"]
    rest = c.list_parts(Bucket=bucket, Key=key, UploadId=uid,
                        PartNumberMarker=first["NextPartNumberMarker"])
    assert [p["PartNumber"] for p in rest["Parts"]] == [3] and not rest["IsTruncated"]
    for k, u in made:
        c.abort_multipart_upload(Bucket=bucket, Key=k, UploadId=u)
    assert c.list_multipart_uploads(Bucket=bucket, Prefix="pg/").get("Uploads", []) == []


def test_s3fs_and_arrow_write_multipart_byte_exact(s3: S3Cluster, sc: Client,
                                                   bucket: str) -> None:
    """Other clients' part sizes: s3fs's 5 MiB blocks and Arrow's 10 MiB parts are no
    whole number of 4 MiB chunks, so their uploads are composed at completion; the
    bytes are the same either way."""
    from stager.testing.s3clients import S3Endpoint

    endpoint = S3Endpoint(s3.url, s3.access_key, s3.secret_key)
    data = data_of(23 * MiB + 5, 11)
    fs = endpoint.s3fs()
    with fs.open(f"{bucket}/other/s3fs.bin", "wb", block_size=5 * MiB) as f:
        for at in range(0, len(data), 3 * MiB):
            f.write(data[at:at + 3 * MiB])
    arrow = endpoint.pyarrow()
    with arrow.open_output_stream(f"{bucket}/other/arrow.bin") as out:
        for at in range(0, len(data), 3 * MiB):
            out.write(data[at:at + 3 * MiB])
    for name in ("s3fs.bin", "arrow.bin"):
        assert sc.cat(f"/mpu/other/{name}") == data, name
        assert fs.cat_file(f"{bucket}/other/{name}") == data, name
    head = endpoint.boto3().head_object(Bucket=bucket, Key="other/s3fs.bin")
    assert head["ETag"].rstrip('"').rsplit("-", 1)[1].isdigit()     # a multipart ETag
