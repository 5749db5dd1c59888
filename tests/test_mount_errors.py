"""Every failure through the mount is an errno a POSIX program understands."""

from __future__ import annotations

import errno
import json
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import start_cluster

from stager import Client
from stager.config import load_config
from stager.protocol.models import LayoutSpec
from stager.testing import ThreadCluster
from stager.testing.mount import Mounted, fuse_unavailable

WHY_NOT = fuse_unavailable()
pytestmark = [pytest.mark.fuse,
              pytest.mark.skipif(WHY_NOT is not None, reason=f"no FUSE here: {WHY_NOT}")]

MiB = 1 << 20


def errno_of(fn: Callable[[], object]) -> int:
    with pytest.raises(OSError) as info:
        fn()
    return int(info.value.errno or 0)


def write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def test_namespace_errors(client: Client, ns: str, here: Path) -> None:
    client.pipe(f"{ns}/file", b"x")
    client.pipe(f"{ns}/full/inner", b"y")
    client.mkdir(f"{ns}/empty")
    assert errno_of(lambda: open(here / "missing", "rb")) == errno.ENOENT
    assert errno_of(lambda: os.mkdir(here / "file")) == errno.EEXIST
    assert errno_of(lambda: os.mkdir(here / "empty")) == errno.EEXIST
    assert errno_of(lambda: open(here / "empty", "rb")) == errno.EISDIR
    assert errno_of(lambda: os.unlink(here / "empty")) == errno.EISDIR
    assert errno_of(lambda: os.listdir(here / "file")) == errno.ENOTDIR
    assert errno_of(lambda: os.rmdir(here / "file")) == errno.ENOTDIR
    assert errno_of(lambda: open(here / "file" / "below", "wb")) == errno.ENOTDIR
    assert errno_of(lambda: os.rmdir(here / "full")) == errno.ENOTEMPTY
    assert errno_of(lambda: os.rename(here / "empty", here / "full")) == errno.ENOTEMPTY
    assert errno_of(lambda: os.rename(here / "file", here / "empty")) == errno.EISDIR
    assert errno_of(lambda: os.rename(here / "empty", here / "file")) == errno.ENOTDIR
    assert errno_of(lambda: os.rename(here / "full", here / "full" / "x")) == errno.EINVAL
    fd = os.open(here / "excl", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    os.close(fd)
    assert errno_of(lambda: os.open(here / "excl", os.O_WRONLY | os.O_CREAT | os.O_EXCL)) \
        == errno.EEXIST


def test_writes_that_are_not_supported_fail_loudly(client: Client, ns: str,
                                                   here: Path) -> None:
    client.pipe(f"{ns}/committed", b"0123456789")
    # Into an existing file: at open when only writing, at write when reading too.
    assert errno_of(lambda: open(here / "committed", "ab")) == errno.EOPNOTSUPP
    assert errno_of(lambda: os.open(here / "committed", os.O_WRONLY)) == errno.EOPNOTSUPP
    fd = os.open(here / "committed", os.O_RDWR)
    try:
        assert os.read(fd, 4) == b"0123"
        assert errno_of(lambda: os.pwrite(fd, b"x", 2)) == errno.EOPNOTSUPP
    finally:
        os.close(fd)
    assert errno_of(lambda: os.truncate(here / "committed", 3)) == errno.EOPNOTSUPP
    assert client.cat(f"{ns}/committed") == b"0123456789"
    # A non-sequential write into a new file: that version is lost, never half-committed.
    fd = os.open(here / "holes", os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"a" * 100)
    assert errno_of(lambda: os.pwrite(fd, b"b", 1000)) == errno.EOPNOTSUPP
    assert errno_of(lambda: os.write(fd, b"c")) == errno.EOPNOTSUPP
    assert errno_of(lambda: os.close(fd)) == errno.EOPNOTSUPP
    assert not client.exists(f"{ns}/holes")
    assert not os.path.exists(here / "holes")


def test_read_only_mount_gives_erofs(client: Client, ns: str, cluster: ThreadCluster,
                                     tmp_path: Path) -> None:
    client.pipe(f"{ns}/f", b"data")
    client.mkdir(f"{ns}/d")
    with Mounted(cluster.meta_url, tmp_path / "ro", path=ns, args=("--read-only",)) as m:
        root = m.mountpoint
        assert (root / "f").read_bytes() == b"data"
        assert errno_of(lambda: write_file(root / "new", b"x")) == errno.EROFS
        assert errno_of(lambda: open(root / "f", "wb")) == errno.EROFS
        assert errno_of(lambda: os.mkdir(root / "e")) == errno.EROFS
        assert errno_of(lambda: os.unlink(root / "f")) == errno.EROFS
        assert errno_of(lambda: os.rmdir(root / "d")) == errno.EROFS
        assert errno_of(lambda: os.rename(root / "f", root / "g")) == errno.EROFS
    assert client.cat(f"{ns}/f") == b"data"


@pytest.fixture
def small_cluster(tmp_path: Path) -> Iterator[ThreadCluster]:
    """Three 6 MiB targets: a 32 MiB file does not fit."""
    c = start_cluster(tmp_path / "small", capacity=6 * MiB)
    yield c
    c.stop()


def test_full_targets_give_enospc(small_cluster: ThreadCluster, tmp_path: Path) -> None:
    with Mounted(small_cluster.meta_url, tmp_path / "m") as m:
        def fill() -> None:
            with open(m.mountpoint / "big", "wb") as f:
                for _ in range(32):
                    f.write(os.urandom(MiB))

        assert errno_of(fill) == errno.ENOSPC
        assert not os.path.exists(m.mountpoint / "big")
        write_file(m.mountpoint / "small", b"still works")
        assert (m.mountpoint / "small").read_bytes() == b"still works"


@pytest.fixture
def fresh_cluster(tmp_path: Path) -> Iterator[ThreadCluster]:
    """A cluster of this test's own, to stop and start servers in."""
    c = start_cluster(tmp_path / "fresh")
    yield c
    c.stop()


def wait_registered(cluster: ThreadCluster, i: int, timeout: float = 10) -> None:
    """Until the metadata server knows data server ``i`` at its new address."""
    url, target = cluster.data[i].url, cluster.target_id(i)  # type: ignore[union-attr]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{cluster.meta_url}/v1/targets", timeout=2) as resp:
            known = {t["id"]: t for t in json.load(resp)["targets"]}
        if known[target]["url"] == url and known[target]["state"] == "up":
            return
        time.sleep(0.05)
    raise TimeoutError(f"data server {i} did not re-register")


def test_data_server_restart_gives_eio_then_recovers(fresh_cluster: ThreadCluster,
                                                     tmp_path: Path) -> None:
    one = LayoutSpec(chunk_size=MiB)          # chunk i on target i % 3: every target used
    data = os.urandom(16 * MiB)
    with Client(fresh_cluster.meta_url, config=load_config(env={})) as c:
        c.pipe("/f.bin", data, layout=one)
        c.pipe("/g.bin", data[::-1], layout=one)
    with Mounted(fresh_cluster.meta_url, tmp_path / "m", args=("--readahead-chunks", "1")) as m:
        held = open(m.mountpoint / "g.bin", "rb", buffering=0)   # open across the restart
        try:
            assert held.read(100) == data[::-1][:100]
            fresh_cluster.stop_data(0)
            assert errno_of(lambda: (m.mountpoint / "f.bin").read_bytes()) == errno.EIO
            fresh_cluster.start_data(0)                # back, at a new address
            wait_registered(fresh_cluster, 0)
            assert (m.mountpoint / "f.bin").read_bytes() == data
            refreshes = m.stats().get("refreshes", 0)
            held.seek(12 * MiB)                        # chunks nobody fetched yet
            assert held.read() == data[::-1][12 * MiB:]
            assert m.stats()["refreshes"] > refreshes  # the open file found the new address
        finally:
            held.close()


def test_metadata_server_down_gives_eio_then_recovers(fresh_cluster: ThreadCluster,
                                                       tmp_path: Path) -> None:
    with Mounted(fresh_cluster.meta_url, tmp_path / "m") as m:
        os.mkdir(m.mountpoint / "before")
        port = int(fresh_cluster.meta_url.rsplit(":", 1)[1])
        fresh_cluster.stop_meta()
        try:
            assert errno_of(lambda: os.listdir(m.mountpoint / "before")) == errno.EIO
            assert errno_of(lambda: os.mkdir(m.mountpoint / "during")) == errno.EIO
        finally:
            fresh_cluster.start_meta(port)
        os.mkdir(m.mountpoint / "after")
        assert sorted(os.listdir(m.mountpoint)) == ["after", "before"]
