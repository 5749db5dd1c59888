"""An attached ``s3://`` directory against moto's S3 server (issue 28, item 1).

The moto fixture of tests/test_stage_s3.py (``ThreadedMotoServer`` on loopback, s3fs
unchanged, the server's request log): the bucket's files read byte-exact through the
Client and fsspec; eight concurrent readers of one object cost one ranged GetObject per
chunk; an object rewritten with other bytes (a new ETag, the same size) is never served
mixed, and after a refresh reads its new bytes; the storage options (endpoint, key,
secret) go to the metadata server once and are never shown again (``GET
/v1/attachments``, ``GET /v1/status``, ``stager status --json``), and are stored
sealed: the secret is in no file of the cluster's root, the store holds a Fernet
token that the server's ``source.key`` opens.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.slow      # moto's S3 server: not in make check

pytest.importorskip("boto3", reason="needs the dev extra (boto3, via moto)")
pytest.importorskip("s3fs", reason="needs the dev extra (s3fs)")
pytest.importorskip("moto.server", reason="needs the dev extra (moto[server])")

import fsspec  # noqa: E402
import test_stage_s3  # noqa: E402
from conftest import raw_http, start_cluster  # noqa: E402
from cryptography.fernet import Fernet  # noqa: E402
from test_stage_s3 import KEY, S3, SECRET, put_multipart  # noqa: E402

from stager import Client  # noqa: E402
from stager.config import load_config  # noqa: E402
from stager.errors import SourceError  # noqa: E402
from stager.testing import ThreadCluster  # noqa: E402

s3 = test_stage_s3.s3          # the moto server fixture, shared by name

KiB, MiB = 1 << 10, 1 << 20
CHUNK = 1 * MiB
BIG = 6 * MiB + 12345           # two multipart parts; 7 chunks
READERS = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("cache-s3"), chunk_size=CHUNK, replicas=2)
    yield c
    c.stop()


@pytest.fixture
def client(cluster: ThreadCluster) -> Iterator[Client]:
    c = Client(cluster.meta_url, config=load_config(env={}))
    yield c
    c.close()


def bucket(s3: S3, name: str, payload: Callable[[int], bytes]) -> dict[str, bytes]:
    """``s3://NAME/data/``: a multipart object, a nested small one, an empty one."""
    s3.api.create_bucket(Bucket=name)
    files = {"sub/small.txt": b"small", "empty": b"", "mid.bin": payload(CHUNK + 77)}
    for rel, data in files.items():
        s3.api.put_object(Bucket=name, Key=f"data/{rel}", Body=data)
    files["big.bin"] = payload(BIG)
    put_multipart(s3, name, "data/big.bin", files["big.bin"])
    return files


def gets(s3: S3, since: int, path: str) -> int:
    """Ranged or whole GetObject requests of ``path`` (/bucket/key) since log entry
    ``since``."""
    return sum(1 for r in s3.requests(since) if r.method == "GET" and r.path == path)


def test_an_attached_bucket_reads_byte_exact_one_get_per_chunk(
        s3: S3, cluster: ThreadCluster, client: Client, ns: str,
        payload: Callable[[int], bytes]) -> None:
    files = bucket(s3, "cache-read", payload)
    got = client.attach("s3://cache-read/data", f"{ns}/b", options=s3.options)
    assert (got.added, got.attachment.files) == (4, 4)
    assert client.stat(f"{ns}/b/big.bin").size == BIG
    seen = len(s3.log)
    readers = [Client(cluster.meta_url, config=load_config(env={})) for _ in range(4)]
    start = threading.Barrier(READERS)

    def read(i: int) -> bytes:
        start.wait()
        return readers[i % 4].cat(f"{ns}/b/big.bin")

    try:
        with ThreadPoolExecutor(READERS) as pool:
            assert all(g == files["big.bin"] for g in pool.map(read, range(READERS)))
    finally:
        for r in readers:
            r.close()
    assert gets(s3, seen, "/cache-read/data/big.bin") == -(-BIG // CHUNK)     # 7
    # the rest through the client and fsspec; cached chunks never ask S3 again
    assert client.cat(f"{ns}/b/sub/small.txt") == b"small"
    assert client.cat(f"{ns}/b/empty") == b""
    fs = fsspec.filesystem("stager", meta_url=cluster.meta_url, skip_instance_cache=True)
    assert fs.cat_file(f"{ns}/b/mid.bin") == files["mid.bin"]
    with fs.open(f"{ns}/b/big.bin", "rb") as f:
        f.seek(3 * CHUNK - 5)
        assert f.read(CHUNK) == files["big.bin"][3 * CHUNK - 5:4 * CHUNK - 5]
    assert fs.cat_file(f"{ns}/b/mid.bin", start=CHUNK) == files["mid.bin"][CHUNK:]
    assert gets(s3, seen, "/cache-read/data/big.bin") == 7
    assert gets(s3, seen, "/cache-read/data/mid.bin") == 2
    [usage] = [a for a in client.attachments() if a.path == f"{ns}/b"]
    assert usage.cached_bytes == sum(map(len, files.values()))


def test_a_rewritten_object_is_never_served_mixed_and_reads_new_after_refresh(
        s3: S3, client: Client, ns: str, payload: Callable[[int], bytes]) -> None:
    s3.api.create_bucket(Bucket="cache-change")
    old = os.urandom(3 * CHUNK)
    s3.api.put_object(Bucket="cache-change", Key="p/x.bin", Body=old)
    client.attach("s3://cache-change/p", f"{ns}/c", options=s3.options)
    assert client.cat(f"{ns}/c/x.bin", 0, 100) == old[:100]         # chunk 0 cached
    # the same size, other bytes: only the ETag tells
    new = os.urandom(3 * CHUNK)
    s3.api.put_object(Bucket="cache-change", Key="p/x.bin", Body=new)
    assert client.cat(f"{ns}/c/x.bin", 0, 100) == old[:100]         # the listed version
    with pytest.raises(SourceError, match="changed since it was listed"):
        client.cat(f"{ns}/c/x.bin")                 # chunks 1 and 2 would be new bytes
    refreshed = client.refresh(f"{ns}/c")
    assert (refreshed.changed, refreshed.unchanged) == (1, 0)
    assert client.cat(f"{ns}/c/x.bin") == new


def test_storage_options_are_never_shown_and_stored_sealed(
        s3: S3, cluster: ThreadCluster, client: Client, ns: str) -> None:
    s3.api.create_bucket(Bucket="cache-secret")
    s3.api.put_object(Bucket="cache-secret", Key="d/f.txt", Body=b"f")
    client.attach("s3://cache-secret/d", f"{ns}/s", options=s3.options)
    assert client.cat(f"{ns}/s/f.txt") == b"f"          # the server used them
    shown = [raw_http(cluster.meta_url, "GET", "/v1/attachments").body,
             raw_http(cluster.meta_url, "GET", "/v1/status").body]
    status = subprocess.run([sys.executable, "-m", "stager", "--meta", cluster.meta_url,
                             "status", "--json"], capture_output=True, timeout=60)
    assert status.returncode == 0, status.stderr
    shown.append(status.stdout)
    assert f"{ns}/s".encode() in shown[0] and f"{ns}/s".encode() in status.stdout
    for body in shown:
        assert SECRET.encode() not in body and KEY.encode() not in body
        assert s3.endpoint.encode() not in body
    # at rest: in no file under the cluster's root (the SQLite file, its WAL, logs) ...
    for path in cluster.root.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    # ... but sealed in the store, opened by the metadata server's source.key
    meta = cluster.root / "meta"
    with sqlite3.connect(meta / "meta.sqlite3") as db:
        [(sealed,)] = db.execute("SELECT options FROM attachments WHERE path = ?",
                                 (f"{ns}/s",)).fetchall()
    key = next(meta.rglob("source.key")).read_bytes().strip()
    assert json.loads(Fernet(key).decrypt(sealed)) == s3.options
