"""Issue 29: bytes written through S3 read back byte-exact through ``stager://``, the
Loader and the FUSE mount, and the other way round.

One real ``stager up --s3-port 0`` cluster (two data servers) for the module.
Samples are written with boto3 (single PUTs, and multipart uploads both through
boto3's transfer manager and by hand), then read by a :class:`stager.Loader`
(``format="files"``, world size 2: the ranks' samples are disjoint and together the
whole set), by ``stager://`` and the Client, and through a FUSE mount of the
cluster.  Files written through the mount, the Client (``pipe``, ``write_many``,
``open("wb")``) and ``stager://`` are read back with GetObject, byte-exact, with the
size and the ETag the gateway documents for them (docs/s3.md: ``"FILE_ID-1"`` for a
file never written through S3).  The mount tests carry the ``fuse`` marker.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from boto3.s3.transfer import TransferConfig

from stager import Client, Loader
from stager.config import load_config
from stager.testing.mount import Mounted, fuse_unavailable
from stager.testing.s3cluster import S3Cluster, boto3_client

pytestmark = [pytest.mark.slow]
MiB = 1 << 20
PART = 5 * MiB                      # S3's smallest part but the last
BUCKET = "readback"
WHY_NO_FUSE = fuse_unavailable()      # the mount's tests skip, saying why (as test_mount's)


def blob(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def md5_etag(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


def multipart_etag(data: bytes, part: int) -> str:
    """S3's ETag of a multipart object: the MD5 of the parts' MD5s, and ``-N``."""
    digests = [hashlib.md5(data[at:at + part]).digest() for at in range(0, len(data), part)]
    return f'"{hashlib.md5(b"".join(digests)).hexdigest()}-{len(digests)}"'


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Cluster]:
    with S3Cluster(tmp_path_factory.mktemp("s3rb"), data_servers=2) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def c(s3: S3Cluster) -> Any:
    api = boto3_client(s3.url)
    api.create_bucket(Bucket=BUCKET)
    yield api
    api.close()


@pytest.fixture(scope="module")
def sc(s3: S3Cluster) -> Iterator[Client]:
    client = Client(s3.meta_url, config=load_config(env={}))
    yield client
    client.close()


@pytest.fixture(scope="module")
def fs(s3: S3Cluster) -> Iterator[Any]:
    f = fsspec.filesystem("stager", meta_url=s3.meta_url, skip_instance_cache=True)
    yield f
    f.close()


@pytest.fixture(scope="module")
def mnt(s3: S3Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mounted]:
    """The S3 cluster's namespace mounted read-write for the module."""
    if WHY_NO_FUSE is not None:
        pytest.skip(f"no FUSE here: {WHY_NO_FUSE}")
    with Mounted(s3.meta_url, tmp_path_factory.mktemp("s3fuse") / "mnt") as m:
        yield m


@pytest.fixture(scope="module")
def samples(c: Any) -> dict[str, bytes]:
    """Objects under ``samples/`` written through boto3, by key: single PUTs of sizes
    around chunk and block edges, nested keys, and three multipart objects (boto3's
    transfer manager, 3 parts; by hand, 2 parts with a short last one; by hand, one
    part)."""
    written: dict[str, bytes] = {}
    for i, size in enumerate([0, 1, 4095, 65_537, 300_001, 1 * MiB + 3, 2 * MiB]):
        key = f"samples/{'deep/er/' if i % 3 == 2 else ''}put{i}.bin"
        data = blob(size, i)
        assert c.put_object(Bucket=BUCKET, Key=key, Body=data)["ETag"] == md5_etag(data)
        written[key] = data
    big = blob(3 * PART - 1000, 100)
    c.upload_fileobj(io.BytesIO(big), BUCKET, "samples/transfer.bin",
                     Config=TransferConfig(multipart_threshold=PART, multipart_chunksize=PART,
                                           max_concurrency=2))
    assert c.head_object(Bucket=BUCKET, Key="samples/transfer.bin")["ETag"] == \
        multipart_etag(big, PART)
    written["samples/transfer.bin"] = big
    for key, data in (("samples/hand.bin", blob(PART + 1234, 101)),
                      ("samples/deep/one-part.bin", blob(777_777, 102))):
        _multipart(c, key, data)
        written[key] = data
    return written


def _multipart(c: Any, key: str, data: bytes) -> None:
    """``data`` at ``key`` by CreateMultipartUpload, UploadPart of ``PART`` bytes each
    (the last shorter), CompleteMultipartUpload; its ETag checked."""
    upload = c.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    parts = []
    for n, at in enumerate(range(0, len(data), PART), start=1):
        put = c.upload_part(Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=n,
                            Body=data[at:at + PART])
        parts.append({"PartNumber": n, "ETag": put["ETag"]})
    done = c.complete_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload,
                                       MultipartUpload={"Parts": parts})
    assert done["ETag"] == multipart_etag(data, PART)


# -- S3 -> stager ----------------------------------------------------------------------
def test_a_loader_of_world_size_2_reads_s3_samples_byte_exact(
        s3: S3Cluster, samples: dict[str, bytes]) -> None:
    ranks: list[dict[str, bytes]] = []
    for rank in range(2):
        with Loader(f"/{BUCKET}/samples", batch_size=2, meta_url=s3.meta_url,
                    format="files", rank=rank, world_size=2, drop_last=False, seed=3,
                    config=load_config(env={})) as loader:
            got: dict[str, bytes] = {}
            for batch in loader:
                for sample in batch:
                    assert sample["__key__"] not in got
                    got[sample["__key__"]] = bytes(sample["data"])
            ranks.append(got)
    assert ranks[0] and ranks[1] and not set(ranks[0]) & set(ranks[1])
    seen = ranks[0] | ranks[1]
    expected = {k.removeprefix("samples/"): v for k, v in samples.items()}
    assert sorted(seen) == sorted(expected)
    for key, data in expected.items():
        assert seen[key] == data, key


def test_stager_fs_and_client_read_s3_samples_byte_exact(
        sc: Client, fs: Any, samples: dict[str, bytes]) -> None:
    for key, data in samples.items():
        path = f"/{BUCKET}/{key}"
        assert sc.cat(path) == data, key
        assert fs.cat_file(path) == data, key
        assert fs.size(path) == len(data)
        with fs.open(path, "rb") as f:
            f.seek(len(data) // 3)
            assert f.read() == data[len(data) // 3:], key
    big = samples["samples/transfer.bin"]
    ranges = [(PART - 10, PART + 10), (2 * PART - 1, 2 * PART + 1), (len(big) - 5, None)]
    got = fs.cat_ranges([f"/{BUCKET}/samples/transfer.bin"] * 3, [r[0] for r in ranges],
                        [r[1] for r in ranges])
    assert got == [big[a:b] for a, b in ranges]     # across the parts' seams


@pytest.mark.fuse
def test_the_mount_reads_s3_samples_byte_exact(mnt: Mounted,
                                               samples: dict[str, bytes]) -> None:
    root = mnt.mountpoint / BUCKET
    on_mount = {p.relative_to(root).as_posix() for p in (root / "samples").rglob("*")
                if p.is_file()}
    assert on_mount == set(samples)
    for key, data in samples.items():
        path = root / key
        assert path.stat().st_size == len(data), key
        assert path.read_bytes() == data, key
        with open(path, "rb") as f:                  # a random read across a seam
            f.seek(max(0, len(data) - PART - 7))
            assert f.read(100) == data[max(0, len(data) - PART - 7):][:100], key


@pytest.mark.fuse
def test_an_object_rewritten_through_s3_reads_new_through_the_mount(
        c: Any, mnt: Mounted, sc: Client, fs: Any) -> None:
    """Close-to-open across the gateway: an ``open`` after a completed PutObject reads
    the new version through the mount and ``stager://``; the Client, whose stat
    cache held the old one, reads one version whole."""
    key, old, new = "rewrite/obj.bin", blob(400_000, 7), blob(250_001, 8)
    c.put_object(Bucket=BUCKET, Key=key, Body=old)
    path = mnt.mountpoint / BUCKET / key
    assert path.read_bytes() == old
    assert sc.cat(f"/{BUCKET}/{key}") == old
    c.put_object(Bucket=BUCKET, Key=key, Body=new)
    assert path.read_bytes() == new
    with fs.open(f"/{BUCKET}/{key}", "rb") as f:
        assert f.read() == new
    assert sc.cat(f"/{BUCKET}/{key}") in (old, new)


# -- stager -> S3 ----------------------------------------------------------------------
def _get_back(c: Any, sc: Client, key: str, data: bytes) -> None:
    """GetObject (whole, and one range) and HeadObject of ``key`` give ``data`` with
    its size and the ETag of a file not written through S3, ``"FILE_ID-1"``; the
    listing agrees."""
    file_id = sc.stat(f"/{BUCKET}/{key}").file_id
    etag = f'"{file_id}-1"'
    got = c.get_object(Bucket=BUCKET, Key=key)
    assert got["Body"].read() == data, key
    assert got["ContentLength"] == len(data)
    assert got["ETag"] == etag
    head = c.head_object(Bucket=BUCKET, Key=key)
    assert (head["ContentLength"], head["ETag"]) == (len(data), etag)
    if data:
        lo, hi = len(data) // 2, len(data) // 2 + 99
        part = c.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={lo}-{hi}")
        assert part["Body"].read() == data[lo:hi + 1]
        assert part["ContentRange"] == f"bytes {lo}-{min(hi, len(data) - 1)}/{len(data)}"
    listed = c.list_objects_v2(Bucket=BUCKET, Prefix=key)["Contents"]
    assert [(o["Key"], o["Size"], o["ETag"]) for o in listed] == [(key, len(data), etag)]


@pytest.mark.fuse
def test_files_written_through_the_mount_read_back_through_s3(
        c: Any, mnt: Mounted, sc: Client, tmp_path: Path) -> None:
    root = mnt.mountpoint / BUCKET / "from-mount"
    root.mkdir()
    written = {"empty.bin": b"", "small.txt": b"hello, s3\n",
               "d/big.bin": blob(3 * MiB + 17, 9), "d/e/mid.bin": blob(200_003, 10)}
    for name, data in written.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        local = tmp_path / name.replace("/", "_")
        local.write_bytes(data)
        with open(local, "rb") as src, open(root / name, "wb") as dst:
            shutil.copyfileobj(src, dst, 256 * 1024)   # many writes, front to back
    os.sync()
    for name, data in written.items():
        _get_back(c, sc, f"from-mount/{name}", data)


def test_files_written_through_the_client_and_fs_read_back_through_s3(
        c: Any, sc: Client, fs: Any) -> None:
    pipe, many, stream, fsspec_ = (blob(1 * MiB + 1, 11), blob(70_000, 12),
                                   blob(2 * MiB + 5, 13), blob(123_457, 14))
    sc.pipe(f"/{BUCKET}/from-client/pipe.bin", pipe)
    small = {f"/{BUCKET}/from-client/many/{i}.bin": blob(1000 * i, 20 + i) for i in range(5)}
    small[f"/{BUCKET}/from-client/many/big.bin"] = many
    results = sc.write_many(list(small.items()))
    assert all(not isinstance(r, BaseException) for r in results), results
    with sc.open(f"/{BUCKET}/from-client/stream.bin", "wb") as f:
        for at in range(0, len(stream), 300_000):
            f.write(stream[at:at + 300_000])
    fs.pipe_file(f"/{BUCKET}/from-client/fsspec.bin", fsspec_)
    _get_back(c, sc, "from-client/pipe.bin", pipe)
    for path, data in small.items():
        _get_back(c, sc, path.removeprefix(f"/{BUCKET}/"), data)
    _get_back(c, sc, "from-client/stream.bin", stream)
    _get_back(c, sc, "from-client/fsspec.bin", fsspec_)
