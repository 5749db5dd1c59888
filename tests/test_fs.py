"""The ``stager://`` fsspec filesystem against a real cluster on loopback."""

from __future__ import annotations

import datetime as dt
import gc
import multiprocessing
import os
import pickle
import random
import time
from collections.abc import Iterator
from pathlib import Path

import crc32c
import fsspec
import pytest
from conftest import STORES, cluster_on_each_store
from fsspec.asyn import sync
from fsspec.callbacks import Callback

from stager.config import load_config
from stager.fs import StagerFileSystem
from stager.fs.info import whole_file_crc32c
from stager.testing import ThreadCluster

KiB = 1024


# Named with an underscore, so that tests/auth/test_fs_auth.py, which imports these
# tests with ``*``, keeps the cluster fixture of its own.
_cluster = pytest.fixture(scope="module", params=STORES, name="cluster")(
    cluster_on_each_store)


@pytest.fixture(scope="module")
def fs(cluster: ThreadCluster) -> Iterator[StagerFileSystem]:
    fs = StagerFileSystem(cluster.meta_url, config=load_config(env={}), skip_instance_cache=True)
    yield fs
    fs.close()


def read_counters(fs: StagerFileSystem) -> tuple[int, int]:
    """(requests, bytes) this filesystem's client has read from data servers."""
    async def snapshot() -> tuple[int, int]:
        counters = fs.client.plane.counters.values()
        return (sum(c.requests for c in counters), sum(c.bytes_read for c in counters))
    return sync(fs.loop, snapshot)


# -- URLs and registration -----------------------------------------------------------------
def test_urls_name_the_cluster(cluster: ThreadCluster, monkeypatch: pytest.MonkeyPatch,
                               ns: str) -> None:
    netloc = cluster.meta_url.removeprefix("http://")
    assert StagerFileSystem._strip_protocol(f"stager://{netloc}/a//b/") == "/a/b"
    assert StagerFileSystem._strip_protocol("stager:///a/b") == "/a/b"
    assert StagerFileSystem._get_kwargs_from_urls(f"stager://{netloc}/a") == {
        "meta_url": cluster.meta_url}
    assert StagerFileSystem._get_kwargs_from_urls("stager:///a") == {}
    assert fsspec.get_filesystem_class("stager") is StagerFileSystem   # the entry point

    with fsspec.open(f"stager://{netloc}{ns}/hello.txt", "wb") as f:
        f.write(b"hello")
    fs, path = fsspec.url_to_fs(f"stager://{netloc}{ns}/hello.txt")
    try:
        assert path == f"{ns}/hello.txt" and fs.meta_url == cluster.meta_url
        assert fs.unstrip_protocol(path) == f"stager://{netloc}{ns}/hello.txt"
        assert fs.cat(path) == b"hello"
    finally:
        fs.close()

    monkeypatch.setenv("STAGER_META_URL", cluster.meta_url)
    fs2 = fsspec.filesystem("stager", skip_instance_cache=True)
    try:
        assert fs2.meta_url == cluster.meta_url
        with fsspec.open(f"stager://{ns}/hello.txt", "rb", skip_instance_cache=True) as f:
            assert f.read() == b"hello"
        assert fs2.cat(f"stager:///{ns.lstrip('/')}/hello.txt") == b"hello"
    finally:
        fs2.close()


def test_pickles_to_the_same_cluster(fs: StagerFileSystem, ns: str) -> None:
    fs.pipe(f"{ns}/p", b"pickled")
    clone = pickle.loads(pickle.dumps(fs))
    try:
        assert clone.meta_url == fs.meta_url and clone.cat(f"{ns}/p") == b"pickled"
    finally:
        clone.close()
    with fs.open(f"{ns}/p") as f:
        f.seek(3)
        again = pickle.loads(pickle.dumps(f))          # an open file reopens where it was
        assert again.read() == b"kled"
        again.close()


# -- info, ls, find, glob --------------------------------------------------------------
def test_info_has_size_type_mtime_checksum_and_layout(fs: StagerFileSystem, ns: str,
                                                      payload) -> None:
    data = payload(300 * KiB + 7)
    before = time.time()
    fs.pipe(f"{ns}/d/a.bin", data, chunk_size="64KiB", replicas=2)
    info = fs.info(f"{ns}/d/a.bin")
    assert info["name"] == f"{ns}/d/a.bin" and info["type"] == "file"
    assert info["size"] == len(data) and before - 1 <= info["mtime"] <= time.time() + 1
    assert info["checksum"] == f"crc32c:{crc32c.crc32c(data):08x}"
    chunks = [data[i:i + 64 * KiB] for i in range(0, len(data), 64 * KiB)]
    assert info["chunk_checksums"] == [f"{crc32c.crc32c(c):08x}" for c in chunks]
    assert info["layout"]["chunk_size"] == 64 * KiB and info["layout"]["replicas"] == 2
    assert len(info["layout"]["targets"]) == 3
    assert isinstance(fs.modified(f"{ns}/d/a.bin"), dt.datetime)
    assert fs.info(ns)["type"] == "directory" and fs.isdir(f"{ns}/d")
    with pytest.raises(FileNotFoundError):
        fs.info(f"{ns}/missing")
    listing = fs.ls(f"{ns}/d")
    assert [e["name"] for e in listing] == [f"{ns}/d/a.bin"]
    assert listing[0]["checksum"] == info["checksum"]          # listings carry it too
    assert fs.ls(f"{ns}/d/a.bin", detail=False) == [f"{ns}/d/a.bin"]


def test_find_and_glob(fs: StagerFileSystem, ns: str) -> None:
    for name in ("a.csv", "b.txt", "sub/c.csv", "sub/deeper/d.csv"):
        fs.pipe(f"{ns}/{name}", name.encode())
    fs.mkdir(f"{ns}/empty")
    assert fs.find(ns) == [f"{ns}/a.csv", f"{ns}/b.txt", f"{ns}/sub/c.csv",
                           f"{ns}/sub/deeper/d.csv"]
    assert f"{ns}/empty" in fs.find(ns, withdirs=True)
    assert fs.find(ns, maxdepth=1) == [f"{ns}/a.csv", f"{ns}/b.txt"]
    assert fs.glob(f"{ns}/*.csv") == [f"{ns}/a.csv"]
    assert fs.glob(f"{ns}/**/*.csv") == [f"{ns}/a.csv", f"{ns}/sub/c.csv",
                                          f"{ns}/sub/deeper/d.csv"]
    assert fs.du(ns) == sum(len(n) for n in ("a.csv", "b.txt", "sub/c.csv", "sub/deeper/d.csv"))


@pytest.mark.parametrize("size", [0, 1, 4096, 4097, 3 * 65536, 1_000_003])
def test_whole_file_crc_folded_from_chunk_crcs(size: int, payload) -> None:
    data = payload(size)
    sums = tuple(crc32c.crc32c(data[i:i + 65536]) for i in range(0, size, 65536))
    assert whole_file_crc32c(sums, 65536, size) == crc32c.crc32c(data)


# -- namespace changes -------------------------------------------------------------------
def test_mkdir_makedirs_rmdir(fs: StagerFileSystem, ns: str) -> None:
    fs.mkdir(f"{ns}/x/y", chunk_size="64KiB")
    assert fs.info(f"{ns}/x/y")["default_layout"] == {"chunk_size": 64 * KiB}
    fs.pipe(f"{ns}/x/y/f", b"1")
    assert fs.info(f"{ns}/x/y/f")["layout"]["chunk_size"] == 64 * KiB   # inherited
    with pytest.raises(FileExistsError):
        fs.mkdir(f"{ns}/x/y")
    fs.makedirs(f"{ns}/x/y", exist_ok=True)
    with pytest.raises(FileExistsError):
        fs.makedirs(f"{ns}/x/y")
    with pytest.raises(OSError):
        fs.rmdir(f"{ns}/x/y")                       # not empty
    fs.rm(f"{ns}/x/y/f")
    fs.rmdir(f"{ns}/x/y")
    assert not fs.exists(f"{ns}/x/y")


def test_rm_globs_directories_and_missing(fs: StagerFileSystem, ns: str) -> None:
    for name in ("a.tmp", "b.tmp", "keep", "d/1", "d/e/2"):
        fs.pipe(f"{ns}/{name}", b"x")
    fs.rm(f"{ns}/*.tmp")
    assert fs.ls(ns, detail=False) == [f"{ns}/d", f"{ns}/keep"]
    fs.rm(f"{ns}/d", recursive=True)
    assert fs.ls(ns, detail=False) == [f"{ns}/keep"]
    with pytest.raises(FileNotFoundError):
        fs.rm(f"{ns}/nothing")


def test_mv_renames_on_the_server(fs: StagerFileSystem, ns: str, payload) -> None:
    data = payload(200 * KiB)
    fs.pipe(f"{ns}/a", data, chunk_size="64KiB")
    file_id = fs.info(f"{ns}/a")["file_id"]
    fs.mv(f"{ns}/a", f"{ns}/new/parent/b")            # parents are made
    assert not fs.exists(f"{ns}/a")
    assert fs.info(f"{ns}/new/parent/b")["file_id"] == file_id   # moved, not copied
    fs.mkdir(f"{ns}/into")
    fs.mv(f"{ns}/new/parent/b", f"{ns}/into")          # into an existing directory
    assert fs.cat(f"{ns}/into/b") == data
    fs.mv(f"{ns}/into", f"{ns}/renamed", recursive=True)
    assert fs.find(ns) == [f"{ns}/renamed/b"]
    fs.pipe(f"{ns}/g1.x", b"1")
    fs.pipe(f"{ns}/g2.x", b"2")
    fs.mkdir(f"{ns}/globbed")
    fs.mv(f"{ns}/g*.x", f"{ns}/globbed/")               # a glob: copy, then remove
    assert fs.ls(f"{ns}/globbed", detail=False) == [f"{ns}/globbed/g1.x", f"{ns}/globbed/g2.x"]
    assert not fs.exists(f"{ns}/g1.x")


# -- reading -----------------------------------------------------------------------------
def test_cat_file_ranges_like_python_slices(fs: StagerFileSystem, ns: str, payload) -> None:
    data = payload(150 * KiB + 3)
    fs.pipe(f"{ns}/f", data, chunk_size="64KiB")
    for start, end in ((None, None), (0, 10), (65530, 65540), (-100, None), (10, -10),
                       (-5, -1), (140 * KiB, 10 << 20), (100, 50), (10 << 20, None)):
        assert fs.cat_file(f"{ns}/f", start, end) == data[start:end], (start, end)


def test_cat_ranges_coalesced_one_request_per_target(fs: StagerFileSystem, ns: str,
                                                     payload) -> None:
    data = {n: payload(64 * KiB * 6 + n) for n in (1, 2)}
    for n, body in data.items():
        fs.pipe(f"{ns}/{n}", body, chunk_size="64KiB")
    rng = random.Random(7)
    names, starts, ends = [], [], []
    for _ in range(200):
        n = rng.choice((1, 2))
        start = rng.randrange(len(data[n]))
        names.append(f"{ns}/{n}")
        starts.append(start)
        ends.append(start + rng.randrange(1, 3000))
    names.append(f"{ns}/missing")
    starts.append(0)
    ends.append(1)
    fs.cat(f"{ns}/1", 0, 1)                 # warm the stat cache and connections
    requests, _ = read_counters(fs)
    got = fs.cat_ranges(names, starts, ends)
    after, _ = read_counters(fs)
    for name, start, end, value in zip(names[:-1], starts, ends, got, strict=False):
        assert value == data[int(name.rsplit("/", 1)[1])][start:end]
    assert isinstance(got[-1], FileNotFoundError)
    assert after - requests == 3            # 200 ranges, 2 files, 3 targets: 3 requests
    with pytest.raises(FileNotFoundError):
        fs.cat_ranges(names, starts, ends, on_error="raise")


def test_cat_ranges_fail_over_to_replicas(tmp_path: Path, payload) -> None:
    from conftest import start_cluster

    cluster = start_cluster(tmp_path, 3)
    fs = StagerFileSystem(cluster.meta_url, config=load_config(env={}), skip_instance_cache=True)
    try:
        data = payload(64 * KiB * 9)
        fs.pipe("/r/f", data, chunk_size="64KiB", replicas=2)
        cluster.stop_data(1)
        starts = list(range(0, len(data), 10_000))
        got = fs.cat_ranges(["/r/f"] * len(starts), starts, [s + 5000 for s in starts])
        assert got == [data[s:s + 5000] for s in starts]
    finally:
        fs.close()
        cluster.stop()


def test_random_reads_fetch_only_what_they_touch(fs: StagerFileSystem, ns: str,
                                                 payload) -> None:
    data = payload(64 * KiB * 16)
    fs.pipe(f"{ns}/f", data, chunk_size="64KiB")
    offsets = [i * 64 * KiB + 1000 for i in (9, 2, 14, 5, 0, 11)]
    with fs.open(f"{ns}/f") as f:
        requests, nbytes = read_counters(fs)
        for off in offsets:
            f.seek(off)
            assert f.read(4000) == data[off:off + 4000]
        after_requests, after_bytes = read_counters(fs)
    assert after_bytes - nbytes == 4000 * len(offsets)
    assert after_requests - requests == len(offsets)


def test_sequential_reads_stream_ahead(fs: StagerFileSystem, ns: str, payload) -> None:
    data = payload(64 * KiB * 32 + 5)
    fs.pipe(f"{ns}/f", data, chunk_size="64KiB")
    with fs.open(f"{ns}/f") as f:
        requests, _ = read_counters(fs)
        parts = [f.read(64 * KiB) for _ in range(3)]
        started, _ = read_counters(fs)
        parts.append(f.read())
    assert b"".join(parts) == data
    # two exact reads, then a stream with the next chunks already in flight
    assert started - requests >= 2 + 4


def test_sequential_reads_of_any_size_read_the_file(fs: StagerFileSystem, ns: str,
                                                    payload) -> None:
    # the stream's buffers are refilled once a read has been joined: reads that
    # end inside a piece, cross pieces or restart the stream must still see the file
    data = payload(64 * KiB * 24 + 11)
    fs.pipe(f"{ns}/f", data, chunk_size="64KiB")
    for step in (1000, 64 * KiB, 100 * KiB + 3, 300 * KiB):
        with fs.open(f"{ns}/f") as f:
            parts = []
            while part := f.read(step):
                parts.append(part)
                if len(parts) == 5:
                    f.seek(-(step // 2), 1)         # back: the stream starts again
                    parts.append(f.read(step // 2))
        whole = b"".join(parts[:5]) + b"".join(parts[6:])
        assert parts[5] == data[5 * step - step // 2:5 * step] and whole == data


def test_readline_and_pandas_style_use(fs: StagerFileSystem, ns: str) -> None:
    lines = [f"line {i}\n".encode() for i in range(20_000)]
    fs.pipe(f"{ns}/t.txt", b"".join(lines), chunk_size="64KiB")
    with fs.open(f"{ns}/t.txt", "rt") as f:
        assert [line.encode() for line in f] == lines
    with pytest.raises(IsADirectoryError):
        fs.open(ns, "rb")


# -- writing -----------------------------------------------------------------------------
def test_write_streams_chunks_and_commits_on_close(fs: StagerFileSystem, ns: str,
                                                   payload) -> None:
    data = payload(64 * KiB * 20)
    path = f"{ns}/w"

    async def written() -> int:
        return sum(c.bytes_written for c in fs.client.plane.counters.values())

    before = sync(fs.loop, written)
    with fs.open(path, "wb", chunk_size="64KiB", block_size=64 * KiB) as f:
        for i in range(0, len(data), 16 * KiB):
            f.write(data[i:i + 16 * KiB])
        assert sync(fs.loop, written) - before >= 64 * KiB * 12     # chunks already went out
        assert not fs.exists(path)                             # but nothing is visible
    assert fs.cat(path) == data
    assert fs.info(path)["layout"]["chunk_size"] == 64 * KiB


def test_failed_or_abandoned_writes_stay_invisible(fs: StagerFileSystem, ns: str) -> None:
    with pytest.raises(KeyError), fs.open(f"{ns}/err", "wb") as f:
        f.write(b"x" * 100_000)
        raise KeyError("boom")
    assert not fs.exists(f"{ns}/err")

    f = fs.open(f"{ns}/dropped", "wb")
    f.write(b"half")
    del f
    gc.collect()
    time.sleep(0.2)
    assert not fs.exists(f"{ns}/dropped")

    f = fs.open(f"{ns}/discarded", "wb")
    f.write(b"y" * 10)
    f.discard()
    f.close()
    assert not fs.exists(f"{ns}/discarded")


def test_exclusive_create_and_transactions(fs: StagerFileSystem, ns: str) -> None:
    fs.pipe(f"{ns}/x", b"old")
    with pytest.raises(FileExistsError):
        fs.open(f"{ns}/x", "xb")                    # fails at open, not at close
    with pytest.raises(FileExistsError):
        fs.pipe_file(f"{ns}/x", b"new", mode="create")
    with pytest.raises(NotImplementedError):
        fs.open(f"{ns}/x", "ab")
    with fs.transaction:
        with fs.open(f"{ns}/t1", "wb") as f:
            f.write(b"1")
        with fs.open(f"{ns}/t2", "wb") as f:
            f.write(b"2")
        assert not fs.exists(f"{ns}/t1")
    assert fs.cat(f"{ns}/t1") == b"1" and fs.cat(f"{ns}/t2") == b"2"


class Recorder(Callback):
    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def set_size(self, size: int) -> None:
        self.sizes.append(size)
        super().set_size(size)


def test_put_and_get_files_and_trees(fs: StagerFileSystem, ns: str, tmp_path: Path,
                                     payload) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    big = payload(9 * (1 << 20) + 11)                 # several parts read in parallel
    (src / "big.bin").write_bytes(big)
    (src / "sub" / "small.txt").write_bytes(b"small")
    os.utime(src / "big.bin", (1_600_000_000.5, 1_600_000_000.5))
    rec = Recorder()
    fs.put_file(str(src / "big.bin"), f"{ns}/one.bin", callback=rec)
    assert rec.sizes == [len(big)] and rec.value == len(big)
    assert fs.info(f"{ns}/one.bin")["mtime"] == 1_600_000_000.5      # the source's mtime
    fs.put(str(src), f"{ns}/tree", recursive=True)
    assert fs.find(f"{ns}/tree") == [f"{ns}/tree/big.bin", f"{ns}/tree/sub/small.txt"]
    assert fs.cat(f"{ns}/tree/big.bin") == big

    out = tmp_path / "out"
    fs.get(f"{ns}/tree", str(out), recursive=True)
    assert (out / "big.bin").read_bytes() == big
    assert (out / "sub" / "small.txt").read_bytes() == b"small"
    assert not [p for p in out.rglob("*") if ".stager-tmp" in p.name]
    rec = Recorder()
    fs.get_file(f"{ns}/one.bin", str(tmp_path / "one.bin"), callback=rec)
    assert (tmp_path / "one.bin").read_bytes() == big and rec.value == len(big)

    fs.cp_file(f"{ns}/one.bin", f"{ns}/copy.bin")
    assert fs.cat(f"{ns}/copy.bin") == big
    assert fs.info(f"{ns}/copy.bin")["file_id"] != fs.info(f"{ns}/one.bin")["file_id"]


# -- processes -----------------------------------------------------------------------------
def _child(fs: StagerFileSystem, path: str, queue: multiprocessing.Queue) -> None:
    try:
        fresh = fsspec.filesystem("stager", meta_url=fs.meta_url)
        queue.put((fs.cat(path), fresh.cat(path), fs.info(path)["size"]))
    except BaseException as exc:   # report, do not hang the parent
        queue.put(repr(exc))


def test_forked_children_use_the_filesystem(fs: StagerFileSystem, ns: str) -> None:
    fs.pipe(f"{ns}/f", b"from the parent")
    assert fs.cat(f"{ns}/f") == b"from the parent"    # the parent's session exists
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    children = [ctx.Process(target=_child, args=(fs, f"{ns}/f", queue)) for _ in range(2)]
    for c in children:
        c.start()
    results = [queue.get(timeout=60) for _ in children]
    for c in children:
        c.join(30)
        assert c.exitcode == 0
    assert results == [(b"from the parent", b"from the parent", 15)] * 2
    assert fs.cat(f"{ns}/f") == b"from the parent"    # the parent is unharmed
