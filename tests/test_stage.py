"""Staging through the library: local trees, HTTP on loopback, memory, stage-out, resume."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from stager import Client
from stager.errors import BadRequest, NotFound
from stager.protocol.models import LayoutSpec
from stager.stage import plan, stage_sync
from stager.testing import ThreadCluster
from stager.testing.cluster import ProcessCluster
from stager.testing.httpserver import HttpServer

MiB = 1 << 20


def make_tree(root: Path, payload) -> dict[str, bytes]:
    files = {
        "big.bin": payload(9 * MiB + 5),          # several ranged parts
        "mid.bin": payload(5 * MiB),
        "a.txt": b"alpha\n",
        "sub/b.csv": b"x,y\n1,2\n",
        "sub/deep/c d.txt": b"with a space",
        "sub/deep/empty": b"",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def staged(client: Client, root: str) -> dict[str, bytes]:
    prefix = root.rstrip("/") + "/"
    return {e.path[len(prefix):]: client.cat(e.path) for e in client.walk(root)}


@pytest.fixture
def tree(tmp_path: Path, payload) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path / "src"
    return root, make_tree(root, payload)


def test_stage_a_local_tree_records_a_manifest(client: Client, ns: str, tree) -> None:
    src, files = tree
    report = stage_sync(client, str(src), f"{ns}/ds")
    assert (report.files, report.copied, report.skipped) == (6, 6, 0)
    assert report.bytes_copied == sum(len(v) for v in files.values())
    assert staged(client, f"{ns}/ds") == files
    for rel in files:       # staged files carry their source's mtime (what resume compares)
        assert client.stat(f"{ns}/ds/{rel}").mtime == pytest.approx(
            os.stat(src / rel).st_mtime, abs=1e-6)
    manifest = client.get_manifest(f"{ns}/ds")
    assert manifest is not None and report.manifest_files == 6
    assert manifest.source == str(src)
    assert {f.path: f.size for f in manifest.files} == {k: len(v) for k, v in files.items()}
    assert all(not f.stale and f.file_id == client.stat(f"{ns}/ds/{f.path}").file_id
               for f in manifest.files)


def test_rerun_skips_unchanged_and_restages_changed(client: Client, ns: str, tree) -> None:
    src, files = tree
    stage_sync(client, str(src), f"{ns}/ds")
    ids = {e.path: e.file_id for e in client.walk(f"{ns}/ds")}
    again = stage_sync(client, str(src), f"{ns}/ds")
    assert (again.copied, again.skipped, again.bytes_copied) == (0, 6, 0)
    assert {e.path: e.file_id for e in client.walk(f"{ns}/ds")} == ids

    (src / "a.txt").write_bytes(b"ALPHA\n")                  # same size, new mtime
    os.utime(src / "a.txt", (time.time() + 5, time.time() + 5))
    (src / "sub" / "b.csv").write_bytes(b"longer,now\n")
    third = stage_sync(client, str(src), f"{ns}/ds")
    assert (third.copied, third.skipped) == (2, 4)
    assert client.cat(f"{ns}/ds/a.txt") == b"ALPHA\n"
    assert client.cat(f"{ns}/ds/sub/b.csv") == b"longer,now\n"
    assert client.stat(f"{ns}/ds/big.bin").file_id == ids[f"{ns}/ds/big.bin"]

    forced = stage_sync(client, str(src), f"{ns}/ds", resume=False)
    assert forced.copied == 6


def test_include_exclude_and_layout(client: Client, ns: str, tree) -> None:
    src, files = tree
    report = stage_sync(client, str(src), f"{ns}/sel", include=["*.txt", "sub/**"],
                          exclude=["empty"], layout=LayoutSpec(chunk_size=MiB, stripe_count=2,
                                                               replicas=2))
    assert sorted(staged(client, f"{ns}/sel")) == ["a.txt", "sub/b.csv", "sub/deep/c d.txt"]
    assert report.files == 3
    layout = client.stat(f"{ns}/sel/a.txt").layout
    assert (layout.chunk_size, layout.stripe_count, layout.replicas) == (MiB, 2, 2)
    # asking for another layout restages even unchanged files
    again = stage_sync(client, str(src), f"{ns}/sel", include=["*.txt"],
                         layout=LayoutSpec(chunk_size=2 * MiB))
    assert again.copied == 2 and client.stat(f"{ns}/sel/a.txt").layout.chunk_size == 2 * MiB


def test_selection_globs() -> None:
    assert plan.selected("x/y/data.parquet", ("*.parquet",))
    assert not plan.selected("x/y/data.csv", ("*.parquet",))
    assert plan.selected("train/a/b/s.tar", ("train/**/*.tar",))
    assert not plan.selected("val/a/s.tar", ("train/**/*.tar",))
    assert not plan.selected("x/.cache/f", (), (".cache/**", "*/.cache/**"))
    assert plan.selected("a", (), ("b",))


def test_stage_a_single_file(client: Client, ns: str, tree) -> None:
    src, files = tree
    stage_sync(client, f"file://{src}/mid.bin", f"{ns}/one.bin")
    assert client.cat(f"{ns}/one.bin") == files["mid.bin"]
    client.mkdir(f"{ns}/dir")
    stage_sync(client, str(src / "a.txt"), f"{ns}/dir")               # into an existing directory
    assert client.cat(f"{ns}/dir/a.txt") == files["a.txt"]
    assert stage_sync(client, str(src / "a.txt"), f"{ns}/dir").skipped == 1
    stage_sync(client, str(src / "a.txt"), f"{ns}/new/")             # a trailing / means "into"
    assert client.cat(f"{ns}/new/a.txt") == files["a.txt"]


def test_stage_from_memory(client: Client, ns: str) -> None:
    mem = fsspec.filesystem("memory")
    mem.pipe({"/stage-src/x/1": b"one", "/stage-src/x/2": b"two" * 1000})
    try:
        stage_sync(client, "memory://stage-src/x", f"{ns}/m")
        assert staged(client, f"{ns}/m") == {"1": b"one", "2": b"two" * 1000}
        assert stage_sync(client, "memory://stage-src/x", f"{ns}/m").skipped == 2
    finally:
        mem.rm("/stage-src", recursive=True)


@pytest.fixture(scope="module")
def http_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HttpServer, Path]]:
    root = tmp_path_factory.mktemp("http")
    import random

    rng = random.Random(3)
    make_tree(root, lambda n: rng.randbytes(n))
    with HttpServer(root) as server:
        yield server, root


def test_stage_from_http_with_etags(client: Client, ns: str, http_tree) -> None:
    server, root = http_tree
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
             if p.is_file()}
    report = stage_sync(client, server.url + "/", f"{ns}/h")
    assert report.copied == len(files)
    assert staged(client, f"{ns}/h") == files            # names with spaces decoded
    manifest = client.get_manifest(f"{ns}/h")
    etags = manifest.extra["source_etags"]
    assert set(etags) == set(files) and all(etags.values())
    assert stage_sync(client, server.url + "/", f"{ns}/h").skipped == len(files)

    # same size, same second: only the ETag tells the file changed
    path = root / "a.txt"
    stat = path.stat()
    path.write_bytes(b"ALPHA\n")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1000))
    third = stage_sync(client, server.url + "/", f"{ns}/h")
    assert third.copied == 1 and client.cat(f"{ns}/h/a.txt") == b"ALPHA\n"


@pytest.fixture
def plain_http(tmp_path: Path, payload) -> Iterator[tuple[str, dict[str, bytes]]]:
    """``python -m http.server``: listings, but no byte ranges (Python 3.11)."""
    files = make_tree(tmp_path, payload)
    proc = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind",
                             "127.0.0.1", "--directory", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    port = re.search(r"port (\d+)", proc.stdout.readline())
    try:
        assert port is not None
        yield f"http://127.0.0.1:{port.group(1)}", files
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_stage_from_a_server_without_ranges(client: Client, ns: str, plain_http) -> None:
    url, files = plain_http
    stage_sync(client, url + "/", f"{ns}/plain")
    assert staged(client, f"{ns}/plain") == files


def test_stage_out_and_back(client: Client, cluster: ThreadCluster, ns: str, tree,
                            tmp_path: Path) -> None:
    src, files = tree
    stage_sync(client, str(src), f"{ns}/res")
    netloc = cluster.meta_url.removeprefix("http://")
    out = tmp_path / "out"
    report = stage_sync(client, f"stager://{netloc}{ns}/res", f"file://{out}")
    assert report.copied == len(files)
    assert {p.relative_to(out).as_posix(): p.read_bytes()
            for p in out.rglob("*") if p.is_file()} == files
    assert not [p for p in out.rglob("*") if ".stager-tmp" in p.name]
    assert stage_sync(client, f"stager://{ns}/res", f"file://{out}").skipped == len(files)

    copied = stage_sync(client, f"stager://{netloc}{ns}/res", f"{ns}/copy")   # stager to stager
    assert copied.copied == len(files) and staged(client, f"{ns}/copy") == files

    mem = fsspec.filesystem("memory")
    try:
        stage_sync(client, f"stager://{ns}/res/sub", "memory://stage-out/r")
        assert mem.cat("/stage-out/r/b.csv") == files["sub/b.csv"]
        assert not [p for p in mem.find("/stage-out") if ".stager-tmp" in p]
    finally:
        mem.rm("/stage-out", recursive=True)


def test_bad_input_is_a_clear_error(client: Client, ns: str, tmp_path: Path) -> None:
    with pytest.raises(BadRequest, match="unknown protocol 'nope'"):
        stage_sync(client, "nope://x", f"{ns}/x")
    with pytest.raises(NotFound, match="does not exist"):
        stage_sync(client, str(tmp_path / "missing"), f"{ns}/x")
    with pytest.raises(BadRequest, match="nothing to stage"):
        stage_sync(client, str(tmp_path), "file:///tmp/elsewhere")
    with pytest.raises(BadRequest, match="names the cluster"):
        stage_sync(client, str(tmp_path), "stager://127.0.0.1:1/x")
    (tmp_path / "f").write_bytes(b"1")
    client.pipe(f"{ns}/file", b"1")
    with pytest.raises(NotADirectoryError, match="is a file"):
        stage_sync(client, str(tmp_path), f"{ns}/file")


def test_interrupted_staging_is_invisible_then_restaged_whole(tmp_path: Path, payload) -> None:
    """SIGKILL the CLI while a large file is half sent; rerun; the file comes back whole."""
    src = tmp_path / "src"
    src.mkdir()
    data = payload(96 * MiB)
    (src / "large.bin").write_bytes(data)
    cluster = ProcessCluster(tmp_path / "cluster", 2)      # servers outlive the client
    cluster.start()
    env = {**os.environ, "STAGER_META_URL": cluster.meta_url}
    cmd = [sys.executable, "-m", "stager", "stage", str(src), "/ds", "--chunk-size", "1MiB",
           "--part-size", "1MiB", "--progress", "never"]
    client = Client(cluster.meta_url)
    try:
        proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE)
        chunks = tmp_path / "cluster"
        deadline = time.monotonic() + 60
        while not any(True for _ in chunks.glob("data*/chunks/*/*/*.[0-9]*")):
            assert proc.poll() is None and time.monotonic() < deadline, "never started"
            time.sleep(0.002)
        proc.kill()
        proc.wait()
        proc.stderr.close()   # type: ignore[union-attr]
        assert not client.exists("/ds/large.bin")
        result = subprocess.run(cmd, env=env, capture_output=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert client.cat("/ds/large.bin") == data
    finally:
        client.close()
        cluster.stop()
        shutil.rmtree(tmp_path / "cluster", ignore_errors=True)


def test_a_large_manifest_arrives_whole(client: Client, ns: str) -> None:
    """A 20,000-file manifest is a body of megabytes: the server must read all of it."""
    import uuid

    from stager.protocol.manifest import Manifest, ManifestFile

    client.mkdir(f"{ns}/big")
    files = tuple(ManifestFile(f"shard-{i:05d}/sample-{i:06d}.tar", 16384, 1.5,
                               uuid.uuid4().hex) for i in range(20_000))
    extra = {"source_etags": {f.path: f'"{uuid.uuid4().hex}"' for f in files}}
    assert client.put_manifest(Manifest(f"{ns}/big", files, extra=extra)) == 20_000
    back = client.get_manifest(f"{ns}/big")
    assert back is not None and len(back.files) == 20_000 and back.extra == extra
