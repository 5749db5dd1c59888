"""A read never fails because its cached stat went stale (issue 29).

One client rewrites (or removes) a file; another still holds the old stat in its
stat cache (``stat_cache_ttl``, made long here so the cache surely holds it).
Before the old chunks are collected, that reader may read the old version,
whole (the documented TTL: docs/client.md, "The stat cache"); once they are
collected, its read finds the chunks gone, stats the path again uncached and
reads the file the path names now, never a mix of the two.  A file opened
before the change reads its own version or fails cleanly (``FileNotFoundError``
naming the path), never a mix and never a ``TargetUnavailable``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_gc import chunk_files

from stager import Client
from stager.config import load_config
from stager.errors import NotFound
from stager.fs import StagerFileSystem
from stager.protocol.models import LayoutSpec
from stager.testing import ThreadCluster

SMALL = 64 * 1024
LAYOUT = LayoutSpec(chunk_size=SMALL, stripe_count=3)
LONG_TTL = 600.0            # the reader's stat cache outlives the test


def collected(cluster: ThreadCluster, file_id: str, timeout: float = 15) -> None:
    """Wait until no data server holds a chunk of ``file_id`` (the metadata server's
    upkeep collects a removed or replaced file's chunks within seconds)."""
    deadline = time.monotonic() + timeout
    while chunk_files(cluster, file_id):
        assert time.monotonic() < deadline, f"chunks of {file_id} never collected"
        time.sleep(0.05)


@pytest.fixture
def stale(cluster: ThreadCluster) -> Iterator[Client]:
    """A second client whose stat cache keeps what it saw for the whole test."""
    c = Client(cluster.meta_url, config=load_config({"stat_cache_ttl": LONG_TTL}, env={}))
    yield c
    c.close()


@pytest.fixture
def stale_fs(cluster: ThreadCluster) -> Iterator[StagerFileSystem]:
    fs = StagerFileSystem(cluster.meta_url, skip_instance_cache=True,
                          config=load_config({"stat_cache_ttl": LONG_TTL}, env={}))
    yield fs
    fs.close()


Rewrite = Callable[[str], tuple[bytes, bytes, str]]


@pytest.fixture
def rewrite(client: Client, payload: Callable[[int], bytes]) -> Rewrite:
    """``rewrite(path)``: write an old version at ``path``, and return a function
    that writes the new one through ``client`` (not the reader)."""
    def make(path: str) -> tuple[bytes, bytes, str]:
        old, new = payload(SMALL * 5 + 11), payload(SMALL * 3 + 7)
        info = client.pipe(path, old, layout=LAYOUT)
        assert info.file_id is not None
        return old, new, info.file_id
    return make


def test_cat_after_the_old_chunks_are_collected(client: Client, stale: Client,
                                                cluster: ThreadCluster, ns: str,
                                                rewrite: Rewrite) -> None:
    path = f"{ns}/f.bin"
    old, new, old_id = rewrite(path)
    assert stale.cat(path) == old                    # its stat now cached
    assert stale.cat(path, 10, 20) == old[10:20]
    client.pipe(path, new, layout=LAYOUT)
    within = stale.cat(path)
    assert within in (old, new)                      # one version whole, never a mix
    collected(cluster, old_id)
    assert stale.cat(path) == new
    assert stale.cat(path, -100) == new[-100:]
    assert stale.aio.meta.cached_stat(path).size == len(new)   # the fresh stat kept


def test_read_into_after_the_old_chunks_are_collected(client: Client, stale: Client,
                                                      cluster: ThreadCluster, ns: str,
                                                      rewrite: Rewrite) -> None:
    path = f"{ns}/into.bin"
    old, new, old_id = rewrite(path)
    buf = bytearray(len(old))
    assert stale.read_into(path, memoryview(buf)) == len(old) and buf == old
    client.pipe(path, new, layout=LAYOUT)
    collected(cluster, old_id)
    buf = bytearray(len(old))
    assert stale.read_into(path, memoryview(buf), 100) == len(new) - 100   # the new size
    assert buf[:len(new) - 100] == new[100:]


def test_cat_of_a_file_removed_elsewhere(client: Client, stale: Client,
                                         cluster: ThreadCluster, ns: str,
                                         rewrite: Rewrite) -> None:
    path = f"{ns}/gone.bin"
    old, _, old_id = rewrite(path)
    assert stale.cat(path) == old
    client.rm(path)
    collected(cluster, old_id)
    with pytest.raises(FileNotFoundError, match="gone.bin"):
        stale.cat(path)


def test_rewritten_twice_keeps_reading_right(client: Client, stale: Client,
                                             cluster: ThreadCluster, ns: str,
                                             rewrite: Rewrite, payload) -> None:
    """The version read after the re-stat is the newest, and the cache learns it."""
    path = f"{ns}/twice.bin"
    old, new, old_id = rewrite(path)
    assert stale.cat(path) == old
    mid = client.pipe(path, new, layout=LAYOUT)
    newest = payload(SMALL + 3)
    client.pipe(path, newest, layout=LAYOUT)
    collected(cluster, old_id)
    collected(cluster, mid.file_id or "")
    assert stale.cat(path) == newest


def test_fsspec_cat_file_and_cat_ranges(client: Client, stale_fs: StagerFileSystem,
                                        cluster: ThreadCluster, ns: str,
                                        rewrite: Rewrite) -> None:
    path = f"{ns}/fs.bin"
    old, new, old_id = rewrite(path)
    assert stale_fs.cat_file(path) == old
    assert stale_fs.cat_ranges([path], [0], [100]) == [old[:100]]
    client.pipe(path, new, layout=LAYOUT)
    collected(cluster, old_id)
    assert stale_fs.cat_file(path, start=5, end=SMALL + 9) == new[5:SMALL + 9]
    assert stale_fs.cat_ranges([path, path], [0, -50], [100, None]) == [new[:100], new[-50:]]
    assert stale_fs.cat_file(path) == new


def test_fsspec_cat_ranges_of_a_removed_file(client: Client, stale_fs: StagerFileSystem,
                                             cluster: ThreadCluster, ns: str,
                                             rewrite: Rewrite) -> None:
    path, other = f"{ns}/gone.bin", f"{ns}/other.bin"
    old, new, old_id = rewrite(path)
    client.pipe(other, new)
    assert stale_fs.cat_ranges([path, other], [0, 0], [10, 10]) == [old[:10], new[:10]]
    client.rm(path)
    collected(cluster, old_id)
    got = stale_fs.cat_ranges([path, other], [0, 0], [10, 10], on_error="return")
    assert isinstance(got[0], FileNotFoundError), got[0]
    assert got[1] == new[:10]


def test_fsspec_open_sees_a_rewrite_at_once(client: Client, stale_fs: StagerFileSystem,
                                            ns: str, rewrite: Rewrite) -> None:
    """Close-to-open: ``open`` always asks the metadata server, whatever is cached."""
    path = f"{ns}/open.bin"
    old, new, _ = rewrite(path)
    assert stale_fs.cat_file(path) == old
    client.pipe(path, new, layout=LAYOUT)
    with stale_fs.open(path, "rb") as f:
        assert f.read() == new


def test_a_file_open_across_the_change(client: Client, stale: Client,
                                       stale_fs: StagerFileSystem, cluster: ThreadCluster,
                                       ns: str, rewrite: Rewrite) -> None:
    """Opened before the rewrite: its own version while its chunks last, then a
    clean ``FileNotFoundError`` (open it again), never bytes of the new version."""
    path = f"{ns}/held.bin"
    old, new, old_id = rewrite(path)
    f = stale.open(path, "rb")
    g = stale_fs.open(path, "rb", block_size=SMALL)
    assert f.read(100) == old[:100]
    assert g.read(100) == old[:100]
    client.pipe(path, new, layout=LAYOUT)
    collected(cluster, old_id)
    with pytest.raises(NotFound, match="held.bin.*open it again"):
        f.seek(SMALL * 2)
        f.read(SMALL)
    with pytest.raises(FileNotFoundError, match="held.bin"):
        g.seek(SMALL * 2)
        g.read(SMALL)
    f.close()
    g.close()
    with stale.open(path, "rb") as again:
        assert again.read() == new


def test_a_cached_file_refreshed_elsewhere(client: Client, stale: Client,
                                           cluster: ThreadCluster, ns: str,
                                           tmp_path: Path, payload) -> None:
    """An attached file changed at its source and refreshed by another client has a
    new file id; the fill of the old one answers 404, and the reader holding the old
    stat reads the new version instead."""
    src = tmp_path / "src"
    src.mkdir()
    old, new = payload(SMALL * 3 + 1), payload(SMALL * 2 + 5)
    (src / "a.bin").write_bytes(old)
    client.attach(f"file://{src}", f"{ns}/view")
    path = f"{ns}/view/a.bin"
    assert stale.cat(path) == old                    # its stat (and CRC32Cs) now kept
    old_id = stale.aio.meta.cached_stat(path).file_id
    (src / "a.bin").write_bytes(new)
    os.utime(src / "a.bin", (time.time() + 5, time.time() + 5))
    assert client.refresh(f"{ns}/view").changed == 1
    collected(cluster, old_id)
    assert stale.cat(path) == new
    assert stale.cat(path, SMALL, SMALL + 10) == new[SMALL:SMALL + 10]


def test_no_stat_cache_and_own_writes_see_a_change_at_once(
        client: Client, stale: Client, cluster: ThreadCluster, ns: str,
        rewrite: Rewrite) -> None:
    """``stat_cache_ttl = 0``: every read by path sees the newest version, before any
    collection; and a client's own write is seen by its next read, whatever its TTL."""
    path = f"{ns}/now.bin"
    old, new, _ = rewrite(path)
    fresh = Client(cluster.meta_url, config=load_config(env={"STAGER_STAT_CACHE_TTL": "0"}))
    try:
        assert fresh.cat(path) == old
        assert stale.cat(path) == old
        client.pipe(path, new, layout=LAYOUT)
        assert fresh.cat(path) == new                # its old chunks are still there
        stale.pipe(path, old, layout=LAYOUT)         # its own write: its cache forgets
        assert stale.cat(path) == old
    finally:
        fresh.close()


def test_the_profile_of_a_stale_read_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m bench.profile_stale_stat`` (docs/client.md quotes its figures),
    one rewrite: it reads the new version through stale stats and prints three lines."""
    from bench.profile_stale_stat import main

    main(1)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "Client.cat through a stale stat", "cat_ranges through a stale stat",
        "Client.cat through a good cached stat"]
