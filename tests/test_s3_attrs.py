"""An S3 object's attributes are its file version's (issue 29): committed with it by the
gateway's PUT, CopyObject and CompleteMultipartUpload, stored by the metadata store,
returned with stat and listing entries, and gone with a version written another way.

Real servers on loopback (a ThreadCluster, the gateway in a thread), boto3 as the S3
client; the bound and the wire shapes through the metadata server's own routes.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from conftest import raw_http, start_cluster

from stager.client import AsyncClient, Client
from stager.config import load_config
from stager.errors import BadRequest
from stager.meta.store.sqlite.store import SQLiteStore
from stager.protocol.models import MAX_ATTRS
from stager.s3.attrs import ObjectAttrs, attrs_of
from stager.testing import ThreadCluster
from stager.testing.metastore import upload
from stager.testing.s3cluster import S3Thread, boto3_client, error_of

BUCKET = "attrs"
PART = 64 << 10             # the cluster's multipart_min_part: small parts here


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("s3attrs"), 2, multipart_min_part=PART)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def s3(cluster: ThreadCluster) -> Iterator[S3Thread]:
    with S3Thread(cluster.meta_url) as gw:
        boto3_client(gw.url).create_bucket(Bucket=BUCKET)
        yield gw


@pytest.fixture(scope="module")
def c(s3: S3Thread) -> Any:
    return boto3_client(s3.url)


@pytest.fixture(scope="module")
def sc(cluster: ThreadCluster) -> Iterator[Client]:
    with Client(cluster.meta_url, config=load_config(env={})) as client:
        yield client


def md5_etag(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


def test_a_put_commits_its_attributes_with_the_file(c: Any, sc: Client,
                                                    cluster: ThreadCluster) -> None:
    c.put_object(Bucket=BUCKET, Key="p/doc.json", Body=b'{"a": 1}',
                 ContentType="application/json", Metadata={"owner": "ada"},
                 CacheControl="no-cache")
    info = sc.stat(f"/{BUCKET}/p/doc.json")
    assert info.attrs["s3"]["etag"] == md5_etag(b'{"a": 1}')
    assert attrs_of(info).content_type == "application/json"
    # a gateway that never saw the object (nothing cached) answers the same, and no
    # hidden record exists beside it
    with S3Thread(cluster.meta_url) as fresh:
        head = boto3_client(fresh.url).head_object(Bucket=BUCKET, Key="p/doc.json")
    assert (head["ContentType"], head["Metadata"], head["CacheControl"]) == \
        ("application/json", {"owner": "ada"}, "no-cache")
    assert head["ETag"] == md5_etag(b'{"a": 1}')
    assert not sc.exists("/.s3")


def test_a_listing_takes_etags_from_its_entries(c: Any, sc: Client) -> None:
    bodies = {f"l/k{i}": f"body {i}".encode() for i in range(5)}
    for key, body in bodies.items():
        c.put_object(Bucket=BUCKET, Key=key, Body=body)
    listed = c.list_objects_v2(Bucket=BUCKET, Prefix="l/")["Contents"]
    assert {o["Key"]: o["ETag"] for o in listed} == \
        {k: md5_etag(b) for k, b in bodies.items()}
    entries = {e.name: e for e in sc.ls(f"/{BUCKET}/l")}
    assert entries["k0"].attrs["s3"]["etag"] == md5_etag(b"body 0")


def test_a_rewrite_by_another_way_has_no_attributes(c: Any, sc: Client) -> None:
    c.put_object(Bucket=BUCKET, Key="r/x.txt", Body=b"one", ContentType="text/plain")
    sc.pipe(f"/{BUCKET}/r/x.txt", b"two")
    info = sc.stat(f"/{BUCKET}/r/x.txt")
    assert info.attrs == {} and "attrs" not in info.to_json()
    head = c.head_object(Bucket=BUCKET, Key="r/x.txt")
    assert head["ContentType"] == "binary/octet-stream"
    assert head["ETag"] == f'"{info.file_id}-1"'


def test_copy_keeps_or_replaces_the_attributes(c: Any) -> None:
    c.put_object(Bucket=BUCKET, Key="c/src", Body=b"copied", ContentType="text/csv",
                 Metadata={"k": "v"})
    c.copy_object(Bucket=BUCKET, Key="c/kept", CopySource={"Bucket": BUCKET, "Key": "c/src"})
    kept = c.head_object(Bucket=BUCKET, Key="c/kept")
    assert (kept["ContentType"], kept["Metadata"], kept["ETag"]) == \
        ("text/csv", {"k": "v"}, md5_etag(b"copied"))
    c.copy_object(Bucket=BUCKET, Key="c/new", CopySource={"Bucket": BUCKET, "Key": "c/src"},
                  MetadataDirective="REPLACE", ContentType="text/plain", Metadata={"n": "1"})
    new = c.head_object(Bucket=BUCKET, Key="c/new")
    assert (new["ContentType"], new["Metadata"]) == ("text/plain", {"n": "1"})


def test_a_multipart_object_has_its_etag_type_and_part_sizes(c: Any, sc: Client) -> None:
    parts = [bytes([i]) * size for i, size in enumerate((PART, PART, 1000), 1)]
    up = c.create_multipart_upload(Bucket=BUCKET, Key="m/big", ContentType="video/mp4")
    done = [{"PartNumber": n, "ETag": c.upload_part(
        Bucket=BUCKET, Key="m/big", UploadId=up["UploadId"], PartNumber=n, Body=body)["ETag"]}
        for n, body in enumerate(parts, 1)]
    answer = c.complete_multipart_upload(Bucket=BUCKET, Key="m/big", UploadId=up["UploadId"],
                                         MultipartUpload={"Parts": done})
    digest = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    assert answer["ETag"] == f'"{digest}-3"'
    head = c.head_object(Bucket=BUCKET, Key="m/big", PartNumber=3)
    assert (head["ContentType"], head["ContentLength"], head["PartsCount"]) == \
        ("video/mp4", 1000, 3)
    assert head["ETag"] == answer["ETag"]
    # run-length encoded: two runs for three parts
    assert sc.stat(f"/{BUCKET}/m/big").attrs["s3"]["part_sizes"] == [[PART, 2], [1000, 1]]


def test_attributes_over_the_bound_are_refused_before_any_byte(c: Any, sc: Client) -> None:
    with pytest.raises(ClientError) as err:
        c.put_object(Bucket=BUCKET, Key="b/too", Body=b"x", ContentType="t/" + "a" * 5000,
                     ContentDisposition="attachment; filename=" + "b" * 5000)
    assert error_of(err) == ("MetadataTooLarge", 400)
    assert not sc.exists(f"/{BUCKET}/b/too")


def test_thousands_of_part_sizes_are_kept_or_the_part_read_refused() -> None:
    even = ObjectAttrs(etag='"e-9000"', parts=9000, part_sizes=(PART,) * 8999 + (5,))
    assert ObjectAttrs.from_json(even.stored()["s3"]) == even
    odd = ObjectAttrs(etag='"o-3000"', parts=3000, part_sizes=tuple(range(PART, PART + 3000)))
    kept = ObjectAttrs.from_json(odd.stored()["s3"])
    assert (kept.parts, kept.part_sizes) == (3000, ())


@pytest.fixture
async def aclient(cluster: ThreadCluster) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(cluster.meta_url, config=load_config(env={})) as client:
        yield client


async def test_a_commit_with_attrs_over_the_bound_is_a_clear_400(aclient: AsyncClient,
                                                                 sc: Client) -> None:
    file_id, writer = await aclient.create("/big-attrs")
    await writer.write(b"abc")
    with pytest.raises(BadRequest, match=f"over the limit of {MAX_ATTRS}"):
        await aclient.commit(file_id, writer, attrs={"s3": "x" * MAX_ATTRS})
    assert not sc.exists("/big-attrs")
    await aclient.abort(file_id)
    file_id, writer = await aclient.create("/small-attrs")
    info = await aclient.commit(file_id, writer, attrs={"tag": ["a", 1]})
    assert info.attrs == {"tag": ["a", 1]} and (await aclient.stat(info.path)).attrs == \
        {"tag": ["a", 1]}


def test_attrs_that_are_no_object_are_a_400_on_the_wire(cluster: ThreadCluster) -> None:
    reply = raw_http(cluster.meta_url, "POST", "/v1/commit", b'{"items": [{"file_id": "'
                     + b"0" * 32 + b'", "size": 0, "checksums": [], "attrs": [1]}]}',
                     {"Content-Type": "application/json"})
    assert reply.status == 400 and b"attrs" in reply.body


async def test_an_sqlite_store_made_before_attrs_gets_the_column(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "meta.db")
    await store.mkdir("/old", parents=False, exist_ok=False, now=1.0)
    store.close()
    db = sqlite3.connect(tmp_path / "meta.db")
    db.execute("ALTER TABLE entries DROP COLUMN attrs")
    db.close()
    again = SQLiteStore(tmp_path / "meta.db")
    try:
        u = upload("a1", "/old/f")
        await again.begin_uploads([u])
        await again.commit_uploads([(u.file_id, 0, (), 1.0, {"k": 1})], now=1.0)
        assert (await again.stat("/old/f")).attrs == {"k": 1}
    finally:
        again.close()
