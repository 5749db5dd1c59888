"""The loader fails over to replicas: a stopped data server, a corrupt chunk copy."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from loader_data import file_bytes, write_files, write_tar

from stager import Client, Loader
from stager.dataplane import DataPlane
from stager.errors import TargetUnavailable
from stager.protocol.models import ReadItem
from stager.testing import ThreadCluster


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[ThreadCluster]:
    c = ThreadCluster(tmp_path / "cluster", 3, replicas=2)
    c.start()
    yield c
    c.stop()


def read_all(meta: str, path: str, **kw: object) -> tuple[list[dict], dict]:
    with Loader(path, batch_size=7, meta_url=meta, drop_last=False, **kw) as loader:
        samples = [s for b in loader for s in b]
        return samples, loader.stats()


def test_a_stopped_data_server_is_read_around(replicated: ThreadCluster) -> None:
    with Client(replicated.meta_url) as c:
        write_files(c, "/ds", 40)
    replicated.stop_data(1)
    gone = replicated.target_id(1)
    samples, stats = read_all(replicated.meta_url, "/ds")
    assert sorted(s["__index__"] for s in samples) == list(range(40))
    for s in samples:
        i = int(s["__key__"].split("/f")[1][:4])
        assert s["data"] == file_bytes(i)
    assert stats["targets"][gone]["errors"] > 0           # it was tried, then avoided


def test_a_corrupt_copy_is_detected_and_read_from_the_other(replicated: ThreadCluster,
                                                            tmp_path: Path) -> None:
    with Client(replicated.meta_url) as c:
        keys = write_tar(c, "/tars", 1, 30)
        info = c.stat("/tars/part-000.tar")
    # flip a byte inside the first member's data on the chunk's primary copy
    primary = info.layout.targets[0]
    index = [replicated.target_id(i) for i in range(3)].index(primary)
    chunk = next((tmp_path / "cluster" / f"data{index}" / "chunks").rglob(f"{info.file_id}.0"))
    raw = bytearray(chunk.read_bytes())
    raw[600] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    # The copy is found bad while the shard is indexed (its first header read) or
    # while its samples are: count the client's errors over both.
    with Client(replicated.meta_url) as c:
        samples, _ = read_all(replicated.meta_url, "/tars", index_cache=None, client=c)
        errors = c.aio.plane.counters[primary].errors
    assert sorted(s["__key__"] for s in samples) == sorted(keys)
    assert all(s["txt"] == s["__key__"].encode() for s in samples)
    assert errors >= 1


def test_no_replica_left_is_a_clear_error(tmp_path: Path) -> None:
    with ThreadCluster(tmp_path / "one", 2) as cluster:
        with Client(cluster.meta_url) as c:
            write_files(c, "/ds", 12)
        with Loader("/ds", batch_size=4, meta_url=cluster.meta_url,
                    config=cluster.config.replace(retries=0)) as loader:
            cluster.stop_data(0)
            cluster.stop_data(1)
            with pytest.raises(TargetUnavailable):
                list(loader)


def test_a_small_file_damaged_on_the_wire_is_caught_and_read_from_the_other(
        replicated: ThreadCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sample that is a whole chunk is checked on arrival against the chunk's
    committed CRC32C: bytes damaged after the server checked them (here, flipped in
    the client's buffer once the batched read returned) fail the read, and the
    samples go to their other copies."""
    with Client(replicated.meta_url) as c:
        data = write_files(c, "/wire", 40)
    damaged: list[str] = []
    real = DataPlane.batch_read_into

    async def flip_first(self: DataPlane, target: str, url: str, items: Sequence[ReadItem],
                         out: memoryview, **kw: object) -> None:
        await real(self, target, url, items, out, **kw)
        if not damaged:
            damaged.append(target)
            out[len(out) // 2] ^= 0xFF
    monkeypatch.setattr(DataPlane, "batch_read_into", flip_first)
    samples, stats = read_all(replicated.meta_url, "/wire", format="files")
    assert len(samples) == 40 and damaged
    for s in samples:
        assert s["data"] == data[int(s["__key__"].split("/f")[1][:4])]
    assert stats["targets"][damaged[0]]["errors"] >= 1
