"""Staging from and to ``s3://`` through s3fs, against moto's S3 server.

There is no S3 on this offline machine; moto's server (``ThreadedMotoServer``,
started in-process on 127.0.0.1:0, as s3fs's own test suite does) is an S3
emulator that speaks the real S3 HTTP API, so s3fs, aiobotocore and botocore
run unchanged: signed requests, ListObjectsV2 pages, ranged GETs, multipart
uploads and their ETags.  It is the one stand-in here, and it stands in only
for AWS itself.  The server's request log (werkzeug's, one record per request)
shows what the stager sent: listings, ranged reads, no per-object HEAD.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow      # moto's S3 server: not in make check

boto3 = pytest.importorskip("boto3", reason="needs the dev extra (boto3, via moto)")
pytest.importorskip("s3fs", reason="needs the dev extra (s3fs)")
moto_server = pytest.importorskip("moto.server", reason="needs the dev extra (moto[server])")

from boto3.s3.transfer import TransferConfig  # noqa: E402

from stager import Client  # noqa: E402
from stager.errors import NotFound  # noqa: E402
from stager.protocol.models import LayoutSpec  # noqa: E402
from stager.sources.open import open_source  # noqa: E402
from stager.sources.source import AsyncSource, source_etag  # noqa: E402
from stager.stage import stage_sync  # noqa: E402
from stager.testing import ThreadCluster  # noqa: E402
from stager.testing.s3clients import stop_moto  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
KEY, SECRET = "stager-test-key", "stager-test-secret"   # moto takes any credentials
PART = 1 * MiB                   # ranged reads of large files, and their chunk size
BIG = 6 * MiB + 12345            # uploaded in two multipart parts: ETag "<md5>-2"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Request:
    method: str
    path: str                    # /bucket/key?query, as sent
    status: int


@dataclass
class S3:
    """The moto server: its endpoint, a boto3 client on it, and its request log."""

    endpoint: str
    api: Any                                       # boto3 S3 client
    log: list[Request] = field(default_factory=list)

    @property
    def options(self) -> dict[str, str]:
        """s3fs storage options naming the endpoint and credentials."""
        return {"endpoint_url": self.endpoint, "key": KEY, "secret": SECRET}

    def cli_options(self) -> list[str]:
        return [a for k, v in self.options.items() for a in ("-o", f"{k}={v}")]

    def requests(self, since: int = 0) -> list[Request]:
        return self.log[since:]


class _RequestLog(logging.Handler):
    """werkzeug logs each request as ``"METHOD PATH HTTP/1.1" STATUS SIZE``."""

    def __init__(self, log: list[Request]) -> None:
        super().__init__(logging.INFO)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if not isinstance(args, tuple) or len(args) != 3:
            return
        line = ANSI.sub("", str(args[0])).split()
        if len(line) == 3 and str(args[1]).isdigit():
            self.log.append(Request(line[0], line[1], int(args[1])))


def _aws_env() -> dict[str, str]:
    """No AWS settings of the machine's, and never the instance metadata service."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE="/nonexistent",
               AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_DEFAULT_REGION="us-east-1")
    return env


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    log: list[Request] = []
    handler = _RequestLog(log)
    werkzeug = logging.getLogger("werkzeug")
    # werkzeug adds its own stderr handler only when the logger has none
    old_level = werkzeug.level
    werkzeug.addHandler(handler)
    werkzeug.setLevel(logging.INFO)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as mp:
        for k in [k for k in os.environ if k.startswith("AWS_")]:
            mp.delenv(k)
        for k, v in _aws_env().items():
            if k.startswith("AWS_"):
                mp.setenv(k, v)
        api = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY,
                           aws_secret_access_key=SECRET, region_name="us-east-1")
        try:
            yield S3(endpoint, api, log)
        finally:
            api.close()
            stop_moto(server)
            werkzeug.removeHandler(handler)
            werkzeug.setLevel(old_level)


def upload_tree(s3: S3, bucket: str, prefix: str,
                payload: Callable[[int], bytes]) -> dict[str, bytes]:
    """Nested directories, a multipart object, an empty one and many small ones."""
    s3.api.create_bucket(Bucket=bucket)
    files = {f"many/f{i:03d}.bin": payload(100 + 37 * i) for i in range(60)}
    files.update({
        "a/b/c/deep.txt": b"deep down",
        "a/b/mid.bin": payload(300 * KiB + 7),
        "empty": b"",
        "name with space.txt": b"spaced",
    })
    for rel, data in files.items():
        s3.api.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=data)
    files["big.bin"] = payload(BIG)
    put_multipart(s3, bucket, f"{prefix}/big.bin", files["big.bin"])
    return files


def put_multipart(s3: S3, bucket: str, key: str, data: bytes) -> None:
    import io

    five = 5 * MiB           # S3's smallest part
    s3.api.upload_fileobj(io.BytesIO(data), bucket, key, Config=TransferConfig(
        multipart_threshold=five, multipart_chunksize=five, use_threads=False))


def staged(client: Client, root: str) -> dict[str, bytes]:
    prefix = root + "/"
    return {f.path[len(prefix):]: client.cat(f.path) for f in client.walk(root)}


def stage_cli(*args: str, meta: str, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in _aws_env().items() if not k.startswith("STAGER_")}
    base["STAGER_META_URL"] = meta
    return subprocess.run([sys.executable, "-m", "stager", "stage", *args],
                          env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=120)


def object_requests(log: list[Request], bucket: str, prefix: str) -> list[Request]:
    """Requests naming one object below ``prefix`` (not listings of the bucket)."""
    return [r for r in log if r.path.startswith(f"/{bucket}/{prefix}/")]


# -- stage-in ------------------------------------------------------------------------
def test_cli_stages_a_tree_byte_exact_then_skips_it(
        s3: S3, cluster: ThreadCluster, client: Client, ns: str,
        payload: Callable[[int], bytes]) -> None:
    files = upload_tree(s3, "cli-bucket", "data/v1", payload)
    dst = f"{ns}/ds"
    r = stage_cli("s3://cli-bucket/data/v1", dst, *s3.cli_options(), "--json",
                  "--chunk-size", "1MiB", "--part-size", "1MiB", meta=cluster.meta_url)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert (report["files"], report["copied"], report["skipped"]) == (len(files), len(files), 0)
    assert report["bytes_copied"] == sum(map(len, files.values()))
    assert staged(client, dst) == files
    big = client.stat(f"{dst}/big.bin")
    assert big.size == BIG and big.layout.chunk_size == MiB
    assert client.stat(f"{dst}/empty").size == 0

    manifest = client.get_manifest(dst)
    assert manifest is not None and manifest.source == "s3://cli-bucket/data/v1"
    assert {f.path: f.size for f in manifest.files} == {k: len(v) for k, v in files.items()}
    etags = manifest.extra["source_etags"]
    assert etags["big.bin"].endswith('-2"')          # S3's multipart ETag, as listed
    assert etags["empty"] == '"d41d8cd98f00b204e9800998ecf8427e"'   # md5 of nothing

    seen = len(s3.log)
    r = stage_cli("s3://cli-bucket/data/v1", dst, *s3.cli_options(), "--json",
                  "--chunk-size", "1MiB", meta=cluster.meta_url)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert (report["copied"], report["skipped"]) == (0, len(files))
    # resumed from the listing alone: no object was read, none asked about one by one
    rerun = s3.requests(seen)
    assert rerun and not [q for q in object_requests(rerun, "cli-bucket", "data/v1")
                          if q.method == "GET"]
    assert all(q.method in ("GET", "HEAD") for q in rerun)
    assert len([q for q in rerun if q.method == "HEAD"]) <= 1      # the root, once


def test_cli_takes_endpoint_and_credentials_from_aws_environment(
        s3: S3, cluster: ThreadCluster, client: Client, ns: str) -> None:
    s3.api.create_bucket(Bucket="env-bucket")
    s3.api.put_object(Bucket="env-bucket", Key="x/one.txt", Body=b"one")
    s3.api.put_object(Bucket="env-bucket", Key="x/sub/two.txt", Body=b"two")
    env = {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_ACCESS_KEY_ID": KEY,
           "AWS_SECRET_ACCESS_KEY": SECRET}
    r = stage_cli("s3://env-bucket/x", f"{ns}/x", meta=cluster.meta_url, env=env)
    assert r.returncode == 0, r.stderr
    assert staged(client, f"{ns}/x") == {"one.txt": b"one", "sub/two.txt": b"two"}


def test_client_stage_reads_large_objects_in_ranged_parts(
        s3: S3, client: Client, ns: str, payload: Callable[[int], bytes]) -> None:
    files = upload_tree(s3, "api-bucket", "ds", payload)
    seen = len(s3.log)
    report = stage_sync(client, "s3://api-bucket/ds", f"{ns}/ds", storage_options=s3.options,
                          layout=LayoutSpec(chunk_size=MiB), part_size=PART)
    assert (report.files, report.copied, report.manifest_files) == (len(files),) * 3
    assert staged(client, f"{ns}/ds") == files

    log = s3.requests(seen)
    big = [q for q in log if q.path == "/api-bucket/ds/big.bin"]
    # one ranged GET (206) per part of the large file, each part once
    assert [q.method for q in big] == ["GET"] * -(-BIG // PART)
    assert {q.status for q in big} == {206}
    # the listing gave every size: no HEAD for any object, one GET per small one
    objects = object_requests(log, "api-bucket", "ds")
    assert not [q for q in objects if q.method == "HEAD"]
    assert len([q for q in objects if q.path != "/api-bucket/ds/big.bin"]) == len(files) - 1


async def test_s3_is_listed_and_read_natively_on_the_loop(s3: S3) -> None:
    """s3fs is async: the source awaits it on the running loop (no thread pool), and its
    listing (ListObjectsV2) carries every size and ETag, so nothing is asked per object."""
    s3.api.create_bucket(Bucket="native-bucket")
    for rel, body in (("d/x", b"x" * 10), ("d/e/y", b"y" * 20)):
        s3.api.put_object(Bucket="native-bucket", Key=f"p/{rel}", Body=body)
    source = open_source("s3://native-bucket/p", **s3.options)
    try:
        assert isinstance(source, AsyncSource)
        seen = len(s3.log)
        files = await source.files()
        assert {k: v["size"] for k, v in files.items()} == {
            "native-bucket/p/d/x": 10, "native-bucket/p/d/e/y": 20}
        assert all(source_etag(v) for v in files.values())
        assert not object_requests(s3.requests(seen), "native-bucket", "p")
        assert await source.read("native-bucket/p/d/e/y", 5, 8) == b"yyy"
    finally:
        await source.close()


def test_changed_objects_are_restaged(s3: S3, client: Client, ns: str,
                                      payload: Callable[[int], bytes]) -> None:
    s3.api.create_bucket(Bucket="change-bucket")
    for name in ("same.bin", "grown.bin", "kept.bin"):
        s3.api.put_object(Bucket="change-bucket", Key=f"p/{name}", Body=b"a" * 1000)
    dst = f"{ns}/p"
    assert stage_sync(client, "s3://change-bucket/p", dst, storage_options=s3.options).copied == 3
    # same size, other bytes: only the ETag tells (LastModified may not move in 1 s)
    s3.api.put_object(Bucket="change-bucket", Key="p/same.bin", Body=b"b" * 1000)
    s3.api.put_object(Bucket="change-bucket", Key="p/grown.bin", Body=b"c" * 1001)
    report = stage_sync(client, "s3://change-bucket/p", dst, storage_options=s3.options)
    assert (report.copied, report.skipped) == (2, 1)
    assert staged(client, dst) == {"same.bin": b"b" * 1000, "grown.bin": b"c" * 1001,
                                   "kept.bin": b"a" * 1000}


def test_missing_bucket_or_prefix_fails_clearly(s3: S3, cluster: ThreadCluster,
                                                client: Client, ns: str) -> None:
    s3.api.create_bucket(Bucket="present-bucket")
    s3.api.put_object(Bucket="present-bucket", Key="here/x", Body=b"x")
    for url in ("s3://no-such-bucket/data", "s3://present-bucket/not-here"):
        r = stage_cli(url, f"{ns}/x", *s3.cli_options(), meta=cluster.meta_url)
        assert r.returncode == 1, r.stderr
        assert f"{url} does not exist" in r.stderr and "Traceback" not in r.stderr
        with pytest.raises(NotFound, match="does not exist"):
            stage_sync(client, url, f"{ns}/x", storage_options=s3.options)
    with pytest.raises(NotFound):
        client.stat(f"{ns}/x")                        # nothing was created


def closed_port() -> int:
    """A loopback port nobody listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# botocore's own retries of a refused connection, cut short (s3fs still retries a few)
NO_RETRIES = ["-o", 'config_kwargs={"retries": {"max_attempts": 1}}']


def test_unreachable_endpoint_or_no_credentials_fail_clearly(
        s3: S3, cluster: ThreadCluster, client: Client, ns: str) -> None:
    nowhere = f"http://127.0.0.1:{closed_port()}"
    r = stage_cli("s3://bkt/data", f"{ns}/x", "-o", f"endpoint_url={nowhere}", "-o",
                  f"key={KEY}", "-o", f"secret={SECRET}", *NO_RETRIES, meta=cluster.meta_url)
    assert r.returncode == 1, r.stderr
    assert "cannot read source s3://bkt/data: EndpointConnectionError" in r.stderr
    assert "Traceback" not in r.stderr
    # no key anywhere (and never the instance metadata service): botocore says so
    r = stage_cli("s3://bkt/data", f"{ns}/x", "-o", f"endpoint_url={s3.endpoint}",
                  meta=cluster.meta_url)
    assert r.returncode == 1, r.stderr
    assert "NoCredentialsError" in r.stderr and "Traceback" not in r.stderr
    client.pipe(f"{ns}/r/a.txt", b"a")
    r = stage_cli(f"stager://{ns}/r", "s3://bkt/out", "-o", f"endpoint_url={nowhere}", "-o",
                  f"key={KEY}", "-o", f"secret={SECRET}", *NO_RETRIES, meta=cluster.meta_url)
    assert r.returncode == 1, r.stderr
    assert "cannot write destination s3://bkt/out: EndpointConnectionError" in r.stderr
    assert "Traceback" not in r.stderr
    with pytest.raises(NotFound):
        client.stat(f"{ns}/x")


# -- stage-out -----------------------------------------------------------------------
def test_stage_out_to_s3(s3: S3, cluster: ThreadCluster, client: Client, ns: str,
                         tmp_path: Path, payload: Callable[[int], bytes]) -> None:
    files = {"r/metrics.json": b'{"loss": 0.1}', "r/empty": b"",
             "ckpt/model.bin": payload(3 * MiB + 5)}
    for rel, data in files.items():
        client.pipe(f"{ns}/results/{rel}", data)
    s3.api.create_bucket(Bucket="out-bucket")
    r = stage_cli(f"stager://{ns}/results", "s3://out-bucket/run1", *s3.cli_options(),
                  "--json", meta=cluster.meta_url)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["copied"] == len(files)
    listed = s3.api.list_objects_v2(Bucket="out-bucket", Prefix="run1/")["Contents"]
    assert {o["Key"]: o["Size"] for o in listed} == {f"run1/{k}": len(v)
                                                     for k, v in files.items()}
    for rel, data in files.items():
        got = s3.api.get_object(Bucket="out-bucket", Key=f"run1/{rel}")["Body"].read()
        assert got == data, rel

    # and back in again, through the sync client: the same bytes
    report = stage_sync(client, "s3://out-bucket/run1", f"{ns}/back", storage_options=s3.options)
    assert report.copied == len(files)
    assert staged(client, f"{ns}/back") == files
