"""boto3 against a real ``stager up --s3-port 0`` cluster: every operation of the gateway.

boto3 runs with its installed version's defaults (1.36 and later: a CRC32 checksum on
every upload, sent in an ``aws-chunked`` trailer), so what is tested is what users
send.  Bytes written through S3 are read back byte-exact through ``stager://`` and the
Client, and the other way round.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from botocore.exceptions import ClientError

from stager import Loader
from stager.client import Client
from stager.config import load_config
from stager.testing.s3cluster import S3Cluster, boto3_client
from stager.testing.s3cluster import error_of as err

pytestmark = [pytest.mark.slow]
MiB = 1 << 20


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Cluster]:
    with S3Cluster(tmp_path_factory.mktemp("s3up"), data_servers=2) as cluster:
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
    c.create_bucket(Bucket="data")
    return "data"


def blob(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


# -- buckets -----------------------------------------------------------------------------
def test_bucket_lifecycle(c: Any, sc: Client) -> None:
    c.create_bucket(Bucket="life")
    assert sc.stat("/life").is_dir
    assert "life" in [b["Name"] for b in c.list_buckets()["Buckets"]]
    assert c.head_bucket(Bucket="life")["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert c.get_bucket_location(Bucket="life")["LocationConstraint"] is None
    with pytest.raises(ClientError) as e:
        c.create_bucket(Bucket="life")
    assert err(e) == ("BucketAlreadyOwnedByYou", 409)
    c.put_object(Bucket="life", Key="deep/down/x", Body=b"x")
    with pytest.raises(ClientError) as e:
        c.delete_bucket(Bucket="life")
    assert err(e) == ("BucketNotEmpty", 409)
    assert sc.cat("/life/deep/down/x") == b"x"
    c.delete_object(Bucket="life", Key="deep/down/x")
    c.delete_bucket(Bucket="life")
    assert not sc.exists("/life")
    with pytest.raises(ClientError) as e:
        c.head_bucket(Bucket="life")
    assert err(e)[1] == 404
    with pytest.raises(ClientError) as e:
        c.list_objects_v2(Bucket="life")
    assert err(e) == ("NoSuchBucket", 404)


def test_a_directory_made_by_stager_is_a_bucket(c: Any, sc: Client) -> None:
    sc.pipe("/made-by-stager/a.txt", b"from stager")
    assert "made-by-stager" in [b["Name"] for b in c.list_buckets()["Buckets"]]
    got = c.get_object(Bucket="made-by-stager", Key="a.txt")
    assert got["Body"].read() == b"from stager"
    assert got["ETag"].endswith('-1"')      # written without S3: no MD5 was made


def test_an_attached_directory_reads_through_s3(c: Any, sc: Client, tmp_path: Path) -> None:
    src = tmp_path / "source"
    (src / "sub").mkdir(parents=True)
    files = {"a.bin": blob(5 * MiB, 21), "sub/b.txt": b"attached"}
    for name, data in files.items():
        (src / name).write_bytes(data)
    sc.attach(f"file://{src}", "/attached/view")
    listed = c.list_objects_v2(Bucket="attached", Prefix="view/")["Contents"]
    assert sorted(o["Key"] for o in listed) == ["view/a.bin", "view/sub/b.txt"]
    for name, data in files.items():
        assert c.get_object(Bucket="attached", Key=f"view/{name}")["Body"].read() == data
    got = c.get_object(Bucket="attached", Key="view/a.bin", Range="bytes=-100")
    assert got["Body"].read() == files["a.bin"][-100:]


# -- put and get -------------------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 1, 4 * MiB, 9 * MiB + 7])
def test_put_get_byte_exact_both_ways(c: Any, sc: Client, bucket: str, size: int) -> None:
    data = blob(size, size)
    put = c.put_object(Bucket=bucket, Key=f"rt/{size}.bin", Body=data)
    assert put["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    got = c.get_object(Bucket=bucket, Key=f"rt/{size}.bin")
    assert got["Body"].read() == data and got["ContentLength"] == size
    assert got["ETag"] == put["ETag"]
    assert sc.cat(f"/{bucket}/rt/{size}.bin") == data
    fs = fsspec.filesystem("stager", meta_url=sc.meta_url, skip_instance_cache=True)
    assert fs.cat_file(f"/{bucket}/rt/{size}.bin") == data
    # ... and the other way round
    sc.pipe(f"/{bucket}/rt/{size}.stager", data[::-1])
    assert c.get_object(Bucket=bucket, Key=f"rt/{size}.stager")["Body"].read() == data[::-1]
    with fs.open(f"/{bucket}/rt/{size}.fsspec", "wb") as f:
        f.write(data)
    assert c.get_object(Bucket=bucket, Key=f"rt/{size}.fsspec")["Body"].read() == data


def test_objects_written_through_s3_feed_a_loader(c: Any, s3: S3Cluster, bucket: str) -> None:
    written = {f"loader/part{i}.bin": blob(100_000 + i, 40 + i) for i in range(6)}
    for key, data in written.items():
        c.put_object(Bucket=bucket, Key=key, Body=data)
    with Loader(f"/{bucket}/loader", batch_size=3, meta_url=s3.meta_url, format="files",
                config=load_config(env={})) as loader:
        seen = {s["__key__"]: bytes(s["data"]) for batch in loader for s in batch}
    assert seen == {k.removeprefix("loader/"): v for k, v in written.items()}


def test_upload_fileobj_and_download_fileobj(c: Any, bucket: str, tmp_path: Path) -> None:
    data = blob(3 * MiB, 3)
    c.upload_fileobj(io.BytesIO(data), bucket, "transfer/obj")
    out = io.BytesIO()
    c.download_fileobj(bucket, "transfer/obj", out)
    assert out.getvalue() == data
    (tmp_path / "f").write_bytes(data)
    c.upload_file(str(tmp_path / "f"), bucket, "transfer/file")
    c.download_file(bucket, "transfer/file", str(tmp_path / "g"))
    assert (tmp_path / "g").read_bytes() == data


def test_head_and_metadata(c: Any, bucket: str) -> None:
    c.put_object(Bucket=bucket, Key="meta/obj", Body=b"payload", ContentType="text/csv",
                 Metadata={"owner": "team-a", "Run": "42"}, CacheControl="no-cache",
                 ContentDisposition='attachment; filename="x.csv"')
    head = c.head_object(Bucket=bucket, Key="meta/obj")
    assert head["ContentType"] == "text/csv"
    assert head["Metadata"] == {"owner": "team-a", "run": "42"}
    assert head["CacheControl"] == "no-cache"
    assert head["ContentDisposition"] == 'attachment; filename="x.csv"'
    assert head["ContentLength"] == 7
    assert isinstance(head["LastModified"], dt.datetime)
    assert abs(head["LastModified"].timestamp() - time.time()) < 120
    raw = head["ResponseMetadata"]["HTTPHeaders"]["last-modified"]
    assert raw.endswith(" GMT") and len(raw) == 29      # RFC 7231
    got = c.get_object(Bucket=bucket, Key="meta/obj", ResponseContentType="x/y")
    assert got["ContentType"] == "x/y" and got["Metadata"]["owner"] == "team-a"


def test_checksums_are_kept_and_returned(c: Any, bucket: str) -> None:
    data = blob(100_000, 9)
    put = c.put_object(Bucket=bucket, Key="sum/crc32", Body=data)
    assert put["ChecksumCRC32"]
    got = c.get_object(Bucket=bucket, Key="sum/crc32", ChecksumMode="ENABLED")
    assert got["ChecksumCRC32"] == put["ChecksumCRC32"]
    assert got["Body"].read() == data       # botocore checks the body against it
    for alg in ("CRC32C", "CRC64NVME", "SHA1", "SHA256"):
        put = c.put_object(Bucket=bucket, Key=f"sum/{alg}", Body=data, ChecksumAlgorithm=alg)
        assert put[f"Checksum{alg}"]
        got = c.get_object(Bucket=bucket, Key=f"sum/{alg}", ChecksumMode="ENABLED")
        assert got[f"Checksum{alg}"] == put[f"Checksum{alg}"] and got["Body"].read() == data
    c.put_object(Bucket=bucket, Key="sum/md5", Body=data,
                 ContentMD5=__import__("base64").b64encode(hashlib.md5(data).digest()).decode())
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket=bucket, Key="sum/bad-md5", Body=data,
                     ContentMD5="AAAAAAAAAAAAAAAAAAAAAA==")
    assert err(e) == ("BadDigest", 400)
    with pytest.raises(ClientError) as e:
        c.head_object(Bucket=bucket, Key="sum/bad-md5")
    assert err(e)[1] == 404


def test_aws_chunked_uploads_over_https(tmp_path: Path) -> None:
    """Over HTTPS boto3 sends its CRC32 in an aws-chunked trailer
    (STREAMING-UNSIGNED-PAYLOAD-TRAILER): the body is decoded and checked, byte-exact."""
    with S3Cluster(tmp_path / "tls", data_servers=1, tls=True) as s3:
        assert s3.url.startswith("https://")
        c = boto3_client(s3.url, verify=s3.ca_file)
        sent: list[dict[str, Any]] = []
        c.meta.events.register("before-send.s3.PutObject",
                               lambda request, **_: sent.append(
                                   {k.lower(): v for k, v in request.headers.items()}))
        c.create_bucket(Bucket="tls")
        data = blob(5 * MiB + 1, 11)
        put = c.put_object(Bucket="tls", Key="chunked", Body=data)
        assert sent[-1]["x-amz-content-sha256"] == b"STREAMING-UNSIGNED-PAYLOAD-TRAILER"
        assert sent[-1]["x-amz-trailer"] == b"x-amz-checksum-crc32"
        assert put["ETag"] == f'"{hashlib.md5(data).hexdigest()}"' and put["ChecksumCRC32"]
        assert c.get_object(Bucket="tls", Key="chunked")["Body"].read() == data
        c.upload_fileobj(io.BytesIO(data[:MiB]), "tls", "fileobj")
        assert sent[-1]["x-amz-content-sha256"] == b"STREAMING-UNSIGNED-PAYLOAD-TRAILER"
        with Client(s3.meta_url, config=load_config({"ca_file": s3.ca_file}, env={})) as sc:
            assert sc.cat("/tls/chunked") == data and sc.cat("/tls/fileobj") == data[:MiB]


# -- ranges, conditions, parts -----------------------------------------------------------
def test_ranges(c: Any, bucket: str) -> None:
    data = blob(5 * MiB + 3, 5)
    c.put_object(Bucket=bucket, Key="range/obj", Body=data)
    for header, want in [("bytes=0-9", data[:10]), ("bytes=-10", data[-10:]),
                         ("bytes=5000000-", data[5000000:]),
                         ("bytes=4194300-4194310", data[4194300:4194311]),
                         ("bytes=10-999999999", data[10:])]:
        got = c.get_object(Bucket=bucket, Key="range/obj", Range=header)
        assert got["Body"].read() == want, header
        assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
        assert got["ContentRange"].endswith(f"/{len(data)}")
    with pytest.raises(ClientError) as e:
        c.get_object(Bucket=bucket, Key="range/obj", Range=f"bytes={len(data)}-")
    assert err(e) == ("InvalidRange", 416)


def test_conditionals(c: Any, bucket: str) -> None:
    put = c.put_object(Bucket=bucket, Key="cond/obj", Body=b"conditional")
    etag = put["ETag"]
    assert c.get_object(Bucket=bucket, Key="cond/obj", IfMatch=etag)["Body"].read() \
        == b"conditional"
    with pytest.raises(ClientError) as e:
        c.get_object(Bucket=bucket, Key="cond/obj", IfMatch='"0000"')
    assert err(e) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as e:
        c.get_object(Bucket=bucket, Key="cond/obj", IfNoneMatch=etag)
    assert err(e)[1] == 304
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    earlier = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    with pytest.raises(ClientError) as e:
        c.get_object(Bucket=bucket, Key="cond/obj", IfModifiedSince=later)
    assert err(e)[1] == 304
    assert c.get_object(Bucket=bucket, Key="cond/obj", IfModifiedSince=earlier)["Body"] \
        .read() == b"conditional"
    with pytest.raises(ClientError) as e:
        c.get_object(Bucket=bucket, Key="cond/obj", IfUnmodifiedSince=earlier)
    assert err(e) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as e:
        c.head_object(Bucket=bucket, Key="cond/obj", IfNoneMatch=etag)
    assert err(e)[1] == 304


def test_conditional_put(c: Any, bucket: str) -> None:
    c.put_object(Bucket=bucket, Key="cond/new", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket=bucket, Key="cond/new", Body=b"second", IfNoneMatch="*")
    assert err(e) == ("PreconditionFailed", 412)
    assert c.get_object(Bucket=bucket, Key="cond/new")["Body"].read() == b"first"


def test_part_number_of_a_single_part_object(c: Any, bucket: str) -> None:
    c.put_object(Bucket=bucket, Key="parts/one", Body=b"0123456789")
    got = c.get_object(Bucket=bucket, Key="parts/one", PartNumber=1)
    assert got["Body"].read() == b"0123456789"
    assert c.head_object(Bucket=bucket, Key="parts/one", PartNumber=1)["ContentLength"] == 10
    with pytest.raises(ClientError) as e:
        c.get_object(Bucket=bucket, Key="parts/one", PartNumber=2)
    assert err(e) == ("InvalidPartNumber", 416)


def test_missing_keys(c: Any, bucket: str) -> None:
    with pytest.raises(c.exceptions.NoSuchKey):
        c.get_object(Bucket=bucket, Key="missing/key")
    with pytest.raises(ClientError) as e:
        c.head_object(Bucket=bucket, Key="missing/key")
    assert err(e)[1] == 404
    with pytest.raises(c.exceptions.NoSuchBucket):
        c.get_object(Bucket="no-such-bucket", Key="k")


# -- copy and delete ---------------------------------------------------------------------
def test_copy_object(c: Any, sc: Client, bucket: str) -> None:
    data = blob(6 * MiB, 6)
    put = c.put_object(Bucket=bucket, Key="copy/src", Body=data, Metadata={"a": "1"},
                       ContentType="image/png")
    out = c.copy_object(Bucket=bucket, Key="copy/dst", CopySource=f"{bucket}/copy/src")
    assert out["CopyObjectResult"]["ETag"] == put["ETag"]
    head = c.head_object(Bucket=bucket, Key="copy/dst")
    assert head["Metadata"] == {"a": "1"} and head["ContentType"] == "image/png"
    assert sc.cat(f"/{bucket}/copy/dst") == data
    c.copy_object(Bucket=bucket, Key="copy/replaced", CopySource={"Bucket": bucket,
                                                                   "Key": "copy/src"},
                  MetadataDirective="REPLACE", Metadata={"b": "2"}, ContentType="text/plain")
    head = c.head_object(Bucket=bucket, Key="copy/replaced")
    assert head["Metadata"] == {"b": "2"} and head["ContentType"] == "text/plain"
    with pytest.raises(ClientError) as e:
        c.copy_object(Bucket=bucket, Key="copy/src", CopySource=f"{bucket}/copy/src")
    assert err(e) == ("InvalidRequest", 400)
    with pytest.raises(ClientError) as e:
        c.copy_object(Bucket=bucket, Key="copy/x", CopySource=f"{bucket}/copy/none")
    assert err(e) == ("NoSuchKey", 404)
    with pytest.raises(ClientError) as e:
        c.copy_object(Bucket=bucket, Key="copy/x", CopySource=f"{bucket}/copy/src",
                      CopySourceIfMatch='"nope"')
    assert err(e) == ("PreconditionFailed", 412)


def test_delete_object_and_objects(c: Any, sc: Client, bucket: str) -> None:
    for i in range(5):
        c.put_object(Bucket=bucket, Key=f"del/sub/{i}", Body=b"x")
    c.delete_object(Bucket=bucket, Key="del/sub/0")
    c.delete_object(Bucket=bucket, Key="del/sub/never-was")
    assert not sc.exists(f"/{bucket}/del/sub/0")
    out = c.delete_objects(Bucket=bucket, Delete={"Objects": [
        {"Key": "del/sub/1"}, {"Key": "del/sub/2"}, {"Key": "del/none"}]})
    assert sorted(d["Key"] for d in out["Deleted"]) == ["del/none", "del/sub/1", "del/sub/2"]
    out = c.delete_objects(Bucket=bucket, Delete={"Objects": [
        {"Key": "del/sub/3"}, {"Key": "del/sub/4"}], "Quiet": True})
    assert "Deleted" not in out and "Errors" not in out
    # the emptied prefixes went with their keys, as on S3
    assert not sc.exists(f"/{bucket}/del")
    assert c.list_objects_v2(Bucket=bucket, Prefix="del/")["KeyCount"] == 0


# -- listing -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tree(c: Any) -> list[str]:
    c.create_bucket(Bucket="tree")
    keys = ["a.txt", "a/b", "a/c/d", "a/c/e", "a-b", "b/x", "top", "z/z/z",
            "sp ace/+plus", "ünï/cödé"]
    for k in keys:
        c.put_object(Bucket="tree", Key=k, Body=k.encode())
    return sorted(keys, key=lambda k: k.encode())


def test_list_v2_order_prefix_delimiter(c: Any, tree: list[str]) -> None:
    got = c.list_objects_v2(Bucket="tree")
    assert [o["Key"] for o in got["Contents"]] == tree
    assert all(o["Size"] == len(o["Key"].encode()) for o in got["Contents"])
    assert all(isinstance(o["LastModified"], dt.datetime) for o in got["Contents"])
    got = c.list_objects_v2(Bucket="tree", Delimiter="/")
    assert [o["Key"] for o in got["Contents"]] == ["a-b", "a.txt", "top"]
    assert [p["Prefix"] for p in got["CommonPrefixes"]] == \
        ["a/", "b/", "sp ace/", "z/", "ünï/"]
    got = c.list_objects_v2(Bucket="tree", Prefix="a/", Delimiter="/")
    assert [o["Key"] for o in got["Contents"]] == ["a/b"]
    assert [p["Prefix"] for p in got["CommonPrefixes"]] == ["a/c/"]
    got = c.list_objects_v2(Bucket="tree", Prefix="a")
    assert [o["Key"] for o in got["Contents"]] == ["a-b", "a.txt", "a/b", "a/c/d", "a/c/e"]
    got = c.list_objects_v2(Bucket="tree", Prefix="a/c/", StartAfter="a/c/d")
    assert [o["Key"] for o in got["Contents"]] == ["a/c/e"]
    got = c.list_objects_v2(Bucket="tree", Delimiter="c")
    assert [p["Prefix"] for p in got["CommonPrefixes"]] == ["a/c", "sp ac", "ünï/c"]
    got = c.list_objects_v2(Bucket="tree", FetchOwner=True, MaxKeys=1)
    assert got["Contents"][0]["Owner"]["ID"] and got["IsTruncated"]


@pytest.mark.parametrize("delimiter", ["", "/"])
def test_list_v2_pages(c: Any, tree: list[str], delimiter: str) -> None:
    whole = c.list_objects_v2(Bucket="tree", Delimiter=delimiter)
    want = [o["Key"] for o in whole.get("Contents", [])] + \
        [p["Prefix"] for p in whole.get("CommonPrefixes", [])]
    pages = c.get_paginator("list_objects_v2").paginate(
        Bucket="tree", Delimiter=delimiter, PaginationConfig={"PageSize": 2})
    got: list[str] = []
    for page in pages:
        assert page["KeyCount"] <= 2
        got += [o["Key"] for o in page.get("Contents", [])]
        got += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
    assert sorted(got) == sorted(want) and len(got) == len(want)


def test_list_v1_with_marker(c: Any, tree: list[str]) -> None:
    assert [o["Key"] for o in c.list_objects(Bucket="tree")["Contents"]] == tree
    got = c.list_objects(Bucket="tree", Marker="a/c/d")
    assert [o["Key"] for o in got["Contents"]] == [k for k in tree if k.encode() > b"a/c/d"]
    pages = c.get_paginator("list_objects").paginate(Bucket="tree",
                                                    PaginationConfig={"PageSize": 3})
    assert [o["Key"] for p in pages for o in p["Contents"]] == tree


# -- more gateways ---------------------------------------------------------------------
def test_a_second_gateway_from_stager_s3(s3: S3Cluster, c: Any, bucket: str,
                                          tmp_path: Path) -> None:
    """``stager s3 --meta URL --port 0``: another gateway over the same cluster sees what
    the first wrote (no state of its own); a non-loopback bind without auth is refused."""
    ready = tmp_path / "s3.json"
    proc = subprocess.Popen([sys.executable, "-m", "stager", "s3", "--meta", s3.meta_url,
                             "--port", "0", "--ready-file", str(ready)])
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        other = boto3_client(json.loads(ready.read_text())["url"])
        c.put_object(Bucket=bucket, Key="two/gateways", Body=b"written by the first",
                     Metadata={"by": "first"})
        got = other.get_object(Bucket=bucket, Key="two/gateways")
        assert got["Body"].read() == b"written by the first"
        assert got["Metadata"] == {"by": "first"} and got["ETag"] == \
            f'"{hashlib.md5(b"written by the first").hexdigest()}"'
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    refused = subprocess.run([sys.executable, "-m", "stager", "s3", "--meta", s3.meta_url,
                              "--host", "0.0.0.0", "--port", "0"], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 1 and "refusing to serve" in refused.stderr


def test_a_killed_gateway_comes_back_on_its_url_with_restart(tmp_path: Path) -> None:
    with S3Cluster(tmp_path / "restart", data_servers=1, restart=True) as s3:
        c = boto3_client(s3.url)
        c.create_bucket(Bucket="again")
        c.put_object(Bucket="again", Key="k", Body=b"kept", ContentType="text/x-kept")
        old = int(s3.cluster.info["s3"]["pid"])
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while int(s3.cluster.reload()["s3"]["pid"]) == old:
            assert time.monotonic() < deadline, "the gateway was not restarted"
            time.sleep(0.05)
        assert s3.cluster.reload()["s3_url"] == s3.url
        got = c.get_object(Bucket="again", Key="k")
        assert got["Body"].read() == b"kept" and got["ContentType"] == "text/x-kept"


# -- memory ------------------------------------------------------------------------------
def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def test_a_large_get_streams_in_bounded_memory(s3: S3Cluster, c: Any, sc: Client,
                                                bucket: str, tmp_path: Path) -> None:
    size = 512 * MiB
    src = tmp_path / "big"
    with open(src, "wb") as f:
        for i in range(size // (8 * MiB)):
            f.write(random.Random(i).randbytes(8 * MiB))
    sc.put(str(src), f"/{bucket}/big")
    pid = int(s3.cluster.info["s3"]["pid"])
    before = _rss(pid)
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss(pid))
            time.sleep(0.01)

    watcher = threading.Thread(target=sample)
    watcher.start()
    digest = hashlib.md5()
    try:
        body = c.get_object(Bucket=bucket, Key="big")["Body"]
        for piece in iter(lambda: body.read(MiB), b""):
            digest.update(piece)
    finally:
        done.set()
        watcher.join()
    want = hashlib.md5()
    with open(src, "rb") as f:
        for piece in iter(lambda: f.read(8 * MiB), b""):
            want.update(piece)
    assert digest.hexdigest() == want.hexdigest()
    print(f"s3 gateway RSS during a {size >> 20} MiB GET: {before >> 20} MiB before, "
          f"{peak[0] >> 20} MiB at most")
    assert peak[0] - before < 128 * MiB, (before, peak[0])
