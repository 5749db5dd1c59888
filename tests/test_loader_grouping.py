"""Consecutive batches are fetched as one group, so a two-level shuffle's
neighbouring samples merge into long reads; a read covering most of a large
chunk fetches the whole chunk (``sendfile`` on the server, CRC32C checked here),
and a bad copy of it is read from the other replica."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loader_data import tar_shard

from stager import Client, Loader
from stager.dataplane.transport import DataPlane
from stager.layout import chunk_targets
from stager.loader.fetch import FetchOptions
from stager.protocol.models import LayoutSpec
from stager.testing import ThreadCluster

CHUNK = 512 << 10            # the smallest chunk the whole-chunk path takes (stream_above)
SAMPLE = 8 << 10
SAMPLES = 256                # 2 MiB and a bit of tar: 5 chunks


def sample_bytes(key: str) -> bytes:
    return (key.encode() * (SAMPLE // len(key) + 1))[:SAMPLE]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ThreadCluster, list[str]]]:
    c = ThreadCluster(tmp_path / "cluster", 3, replicas=2)
    c.start()
    keys = [f"s{i:04d}" for i in range(SAMPLES)]
    with Client(c.meta_url) as client:
        client.pipe("/ds/part-000.tar", tar_shard(keys, {"bin": sample_bytes}),
                    layout=LayoutSpec(chunk_size=CHUNK))
    yield c, keys
    c.stop()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the requests the loader sends (the real calls still go out)."""
    counts = {"batched": 0, "whole": 0}
    batch, chunk = DataPlane.batch_read_into, DataPlane.read_chunk_into

    async def batched(self: DataPlane, *args: Any, **kw: Any) -> Any:
        counts["batched"] += 1
        return await batch(self, *args, **kw)

    async def whole(self: DataPlane, *args: Any, **kw: Any) -> Any:
        if kw.get("whole"):
            counts["whole"] += 1
        return await chunk(self, *args, **kw)

    monkeypatch.setattr(DataPlane, "batch_read_into", batched)
    monkeypatch.setattr(DataPlane, "read_chunk_into", whole)
    return counts


def read_epoch(meta: str, reads: dict[str, int], **kw: Any
               ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One epoch; ``reads`` counts only its requests (not indexing the shard)."""
    kw.setdefault("prefetch_batches", 16)
    # a shuffle window of exactly 128 positions (block_window: windows of
    # positions, not of whole blocks): the 8 batches of a full group cover one,
    # so they read most of each chunk the window draws from
    if kw.get("shuffle", True):
        kw.setdefault("order", "block_window")
    with Loader("/ds", meta_url=meta, batch_size=16, seed=5, index_cache=None,
                shuffle_window=128, prefetch_next_epoch=False, **kw) as loader:
        assert loader.format == "tar"
        reads.update(batched=0, whole=0)
        return [s for b in loader for s in b], loader.stats()


def check(samples: list[dict[str, Any]], keys: list[str]) -> None:
    assert sorted(s["__key__"] for s in samples) == keys
    assert [s["__key__"] for s in samples] != keys          # shuffled
    for s in samples:
        assert s["bin"] == sample_bytes(s["__key__"])


def test_groups_read_whole_chunks_where_a_batch_alone_reads_scattered_samples(
        cluster: tuple[ThreadCluster, list[str]], reads: dict[str, int]) -> None:
    c, keys = cluster
    grouped, _ = read_epoch(c.meta_url, reads)
    check(grouped, keys)
    assert reads["whole"] >= 2, reads               # dense groups: whole chunks
    merged = sum(reads.values())
    # the same epoch with the whole-chunk path off: the same samples, in the same
    # order, all from batched ranged reads
    ranged, _ = read_epoch(c.meta_url, reads, fetch=FetchOptions(whole_chunk_above=2.0))
    assert [s["__key__"] for s in ranged] == [s["__key__"] for s in grouped]
    assert reads["whole"] == 0 and reads["batched"] > 0, reads
    # a window of 2 batches fetches each batch alone: many more requests
    alone, _ = read_epoch(c.meta_url, reads, prefetch_batches=2)
    assert [s["__key__"] for s in alone] == [s["__key__"] for s in grouped]
    assert reads["whole"] == 0 and merged < 0.6 * reads["batched"], (merged, reads)


def test_a_corrupt_copy_of_a_whole_chunk_read_is_read_from_the_other(
        cluster: tuple[ThreadCluster, list[str]], reads: dict[str, int],
        tmp_path: Path) -> None:
    c, keys = cluster
    with Client(c.meta_url) as client:
        info = client.stat("/ds/part-000.tar")
    assert info.layout is not None and info.file_id is not None
    targets = [c.target_id(i) for i in range(3)]
    broken = set()
    for index in range(info.size // CHUNK):         # every full chunk's first copy
        primary = chunk_targets(info.layout, index)[0]
        node = targets.index(primary)
        path = next((tmp_path / "cluster" / f"data{node}" / "chunks").rglob(
            f"{info.file_id}.{index}"))
        raw = bytearray(path.read_bytes())
        raw[CHUNK // 2] ^= 0xFF                     # inside a sample's bytes
        path.write_bytes(bytes(raw))
        broken.add(primary)
    samples, stats = read_epoch(c.meta_url, reads)
    check(samples, keys)
    assert reads["whole"] >= 2, reads
    assert all(stats["targets"][t]["errors"] >= 1 for t in broken), stats["targets"]


def test_an_unshuffled_order_is_fetched_in_groups_too(
        cluster: tuple[ThreadCluster, list[str]], reads: dict[str, int]) -> None:
    """Without shuffling, each batch moves on to the next block; those batches
    still join one group (their samples follow each other), so chunks are read
    whole rather than a batch's share at a time."""
    c, keys = cluster
    grouped, _ = read_epoch(c.meta_url, reads, shuffle=False)
    assert [s["__key__"] for s in grouped] == keys
    assert all(s["bin"] == sample_bytes(s["__key__"]) for s in grouped)
    merged = dict(reads)
    alone, _ = read_epoch(c.meta_url, reads, shuffle=False, prefetch_batches=2)
    assert [s["__key__"] for s in alone] == keys
    assert merged["whole"] >= 3 and reads["whole"] == 0, (merged, reads)
    assert sum(merged.values()) < 0.6 * sum(reads.values()), (merged, reads)


def test_a_shuffle_window_is_read_by_one_group_whole_chunk_by_whole_chunk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A window of 8 blocks (chunks) holds 7.5 batches of 64, so batches straddle
    two windows, and a window (4 MiB) is larger than ``bytes_in_flight``.  Yet each
    window is fetched by one group: a straddling batch's samples in the group's
    chunks go with it and the rest with the next group, a group past
    ``bytes_in_flight`` still takes the rest of its window, and no window splits
    a block.  So each chunk is read whole once, and ranged reads carry only the
    first groups (of 1, 1, 2 and 4 batches: they come soonest)."""
    keys = [f"s{i:05d}" for i in range(15 * SAMPLES)]      # 32 MiB: 64 chunks
    whole: list[str] = []
    ranged = [0]
    batch, chunk = DataPlane.batch_read_into, DataPlane.read_chunk_into

    async def batched(self: DataPlane, target: str, url: str, items: Any, out: Any,
                      **kw: Any) -> Any:
        ranged[0] += len(out)
        return await batch(self, target, url, items, out, **kw)

    async def read_chunk(self: DataPlane, target: str, url: str, name: str, *args: Any,
                         **kw: Any) -> Any:
        if kw.get("whole"):
            whole.append(name)
        return await chunk(self, target, url, name, *args, **kw)

    with ThreadCluster(tmp_path / "cluster", 3, replicas=1) as c:
        with Client(c.meta_url) as client:
            client.pipe("/ds/part-000.tar", tar_shard(keys, {"bin": sample_bytes}),
                        layout=LayoutSpec(chunk_size=CHUNK))
        monkeypatch.setattr(DataPlane, "batch_read_into", batched)
        monkeypatch.setattr(DataPlane, "read_chunk_into", read_chunk)
        with Loader("/ds", meta_url=c.meta_url, batch_size=64, seed=5, index_cache=None,
                    prefetch_batches=16, prefetch_bytes=64 << 20,
                    fetch=FetchOptions(bytes_in_flight=3 << 20),
                    prefetch_next_epoch=False, drop_last=False) as loader:
            assert loader.window > 7 * 64
            whole.clear()
            ranged[0] = 0
            samples = [s for b in loader for s in b]
    check(samples, keys)
    total = len(keys) * SAMPLE
    # (before windows of whole blocks and the split: 24 chunks whole, 83 % ranged)
    assert len(whole) == len(set(whole)) >= 48, whole
    assert ranged[0] < 0.3 * total, (ranged[0], total)
