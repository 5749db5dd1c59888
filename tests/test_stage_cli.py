"""``stager stage`` as a user runs it: a subprocess, its exit code, its messages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stager import Client
from stager.testing import ThreadCluster
from stager.testing.httpserver import HttpServer

pytestmark = pytest.mark.slow      # the CLI, a process per command: not in make check


def stage(*args: str, meta: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
    if meta:
        env["STAGER_META_URL"] = meta
    return subprocess.run([sys.executable, "-m", "stager", "stage", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_stage_in_and_out_with_a_report(cluster: ThreadCluster, client: Client, ns: str,
                                        tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "x.bin").write_bytes(b"x" * 5000)
    (src / "skip.tmp").write_bytes(b"t")
    netloc = cluster.meta_url.removeprefix("http://")
    # the cluster comes from the stager:// URL: no --meta, no environment
    r = stage(str(src), f"stager://{netloc}{ns}/ds", "--exclude", "*.tmp", "--json",
              "--chunk-size", "64KiB", "--replicas", "2")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert (report["files"], report["copied"], report["manifest_files"]) == (1, 1, 1)
    assert "staged 1 file(s)" in r.stderr and "\x1b[" not in r.stderr   # quiet: no bar
    info = client.stat(f"{ns}/ds/d/x.bin")
    assert info.layout.chunk_size == 64 * 1024 and info.layout.replicas == 2

    out = tmp_path / "out"
    r = stage(f"stager://{ns}/ds", f"file://{out}", meta=cluster.meta_url)
    assert r.returncode == 0, r.stderr
    assert (out / "d" / "x.bin").read_bytes() == b"x" * 5000

    r = stage(str(src), f"{ns}/ds2", "--progress", "always", "-o", "auto_mkdir=true",
              meta=cluster.meta_url)
    assert r.returncode == 0, r.stderr
    assert "2/2 files" in r.stderr and "B/s" in r.stderr            # files, rate


def test_unknown_protocol_and_missing_source(cluster: ThreadCluster, ns: str,
                                             tmp_path: Path) -> None:
    r = stage("nope://bucket/x", f"{ns}/x", meta=cluster.meta_url)
    assert r.returncode == 1 and "unknown protocol 'nope'" in r.stderr
    assert "Traceback" not in r.stderr
    r = stage(f"file://{tmp_path}/missing", f"{ns}/x", meta=cluster.meta_url)
    assert r.returncode == 1 and f"{tmp_path}/missing does not exist" in r.stderr
    r = stage(str(tmp_path), f"{ns}/x", "-o", "no-value", meta=cluster.meta_url)
    assert r.returncode == 1 and "KEY=VALUE" in r.stderr


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_unreadable_file_fails_clearly_and_stages_nothing_half(
        cluster: ThreadCluster, client: Client, ns: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a" * 1000)
    (src / "secret.bin").write_bytes(b"s" * 10_000_000)
    (src / "secret.bin").chmod(0)
    env = {**os.environ, "STAGER_META_URL": cluster.meta_url}
    # Root reads everything; without CAP_DAC_OVERRIDE it meets file permissions like anyone.
    r = subprocess.run(["setpriv", "--bounding-set", "-dac_override,-dac_read_search",
                        sys.executable, "-m", "stager", "stage", str(src), f"{ns}/ds"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "secret.bin" in r.stderr and "Permission denied" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not client.exists(f"{ns}/ds/secret.bin")
    assert client.get_manifest(f"{ns}/ds") is None                 # no dataset recorded


@pytest.fixture
def forbidding_server(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "ok.txt").write_bytes(b"ok")
    (tmp_path / "private.txt").write_bytes(b"private")
    (tmp_path / "private.txt").chmod(0o600)
    with HttpServer(tmp_path) as server:
        yield server.url


def test_http_403_names_the_file(cluster: ThreadCluster, client: Client, ns: str,
                                 forbidding_server: str) -> None:
    r = stage(forbidding_server + "/", f"{ns}/h", meta=cluster.meta_url)
    assert r.returncode == 1
    assert "private.txt" in r.stderr and "HTTP 403" in r.stderr, r.stderr
    assert not client.exists(f"{ns}/h/private.txt")


@pytest.fixture
def full_cluster(tmp_path_factory: pytest.TempPathFactory, slow_callbacks) -> Iterator[
        ThreadCluster]:
    from conftest import start_cluster

    c = start_cluster(tmp_path_factory.mktemp("full"), 2, capacity=2 << 20)
    yield c
    c.stop()


def test_full_target_fails_clearly(full_cluster: ThreadCluster, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "small.bin").write_bytes(b"s" * 1000)
    (src / "huge.bin").write_bytes(os.urandom(12 << 20))
    r = stage(str(src), "/ds", "--chunk-size", "1MiB", meta=full_cluster.meta_url)
    assert r.returncode == 1
    assert "huge.bin" in r.stderr and "full" in r.stderr, r.stderr
    with Client(full_cluster.meta_url) as c:
        assert not c.exists("/ds/huge.bin")
        assert c.get_manifest("/ds") is None
