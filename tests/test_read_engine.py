"""The one read engine: plans as arrays, one routing decision, one set of errors.

Every entry point (the striped reader, fsspec's ``cat_ranges``, the Loader's
fetch) only builds a plan for :class:`~stager.dataplane.engine.ReadEngine`, so a
chunk no replica can serve fails the same way through each of them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import fsspec
import numpy as np
import pytest

from stager import AsyncClient
from stager.dataplane import DataPlane
from stager.dataplane.engine import ReadEngine
from stager.dataplane.readplan import FileTable, ReadOptions
from stager.errors import CorruptChunk, TargetUnavailable
from stager.loader.fetch import Fetcher
from stager.loader.spans import Spans
from stager.protocol.models import FileInfo, Layout, LayoutSpec
from stager.testing import ThreadCluster

SMALL = 64 * 1024


def _file(size: int, chunk: int = SMALL) -> FileInfo:
    targets = ("t0", "t1", "t2")
    return FileInfo("/f", "file", size=size, file_id="f1",
                    layout=Layout(chunk, 3, 1, targets, ("n0", "n1", "n2")),
                    checksums=tuple(range((size + chunk - 1) // chunk)),
                    locations={t: f"http://{t}" for t in targets})


def test_a_plan_cuts_extents_into_chunk_pieces_sorted_by_chunk() -> None:
    table = FileTable([_file(5 * SMALL + 10)])
    plan = table.plan(np.array([0, 0, 0, 0]), np.array([3 * SMALL + 5, 100, 0, SMALL - 10]),
                      np.array([2 * SMALL, 50, 0, 20]))
    rows = list(zip(plan.chunk.tolist(), plan.offset.tolist(), plan.length.tolist(),
                    plan.dest.tolist(), plan.at.tolist(), plan.alone.tolist(), strict=True))
    assert plan.chunk.tolist() == sorted(plan.chunk.tolist())
    assert sorted(rows) == [
        (0, 100, 50, 1, 0, True),                       # inside chunk 0: its own bytes
        (0, SMALL - 10, 10, 3, 0, False),               # across chunks 0 and 1
        (1, 0, 10, 3, 10, False),
        (2, 5, SMALL - 5, 0, 0, False),                 # across chunks 3, 4 and 5
        (3, 0, SMALL, 0, SMALL - 5, False),
        (4, 0, 5, 0, 2 * SMALL - 5, False),
    ]
    assert plan.bounds.tolist() == [0, 2, 3, 4, 5, 6]  # the pieces of each chunk row
    assert plan.chunks.full.tolist() == [SMALL, SMALL, SMALL, SMALL, 10]
    with pytest.raises(ValueError, match="outside"):
        table.plan(np.array([0]), np.array([5 * SMALL]), np.array([11]))


async def test_every_entry_point_raises_the_same_error(cluster: ThreadCluster, ns: str,
                                                      payload: Any) -> None:
    """A chunk whose one replica is unknown: the reader and the Loader raise one
    error, ``cat_ranges`` hands it back in the range's place; the chunks of other
    targets still read."""
    data = payload(3 * SMALL)
    async with AsyncClient(cluster.meta_url) as c:
        info = await c.pipe(f"{ns}/gone.bin", data,
                            layout=LayoutSpec(chunk_size=SMALL, stripe_count=3, replicas=1))
        info = await c.stat(f"{ns}/gone.bin")
        assert info.layout is not None
        lost = info.layout.targets[1]                   # holds chunk 1 only
        gone = replace(info, locations={t: u for t, u in info.locations.items() if t != lost})
        with pytest.raises(TargetUnavailable) as striped:
            await c.reader(gone).read()
        with pytest.raises(TargetUnavailable) as fetched:
            await Fetcher(c, [gone]).fetch(Spans.of([(0, 0, 3 * SMALL)]))
        engine = ReadEngine(c.plane, c.limit, ReadOptions(retries=c.config.retries))
        ranged = await engine.read_extents(FileTable([gone]), np.array([0, 0]),
                                           np.array([SMALL + 5, 0]), np.array([10, 10]),
                                           raise_errors=False)
        assert ranged[1] == data[:10]
        assert isinstance(ranged[0], TargetUnavailable)
        for err in (striped.value, fetched.value, ranged[0]):
            assert str(err) == str(striped.value)
            assert err.details == striped.value.details
            assert err.details["target"] == lost and lost in str(err)
        assert await c.reader(gone).read(0, SMALL) == data[:SMALL]


def test_cat_ranges_errors_in_place(cluster: ThreadCluster, ns: str, payload: Any) -> None:
    data = payload(2 * SMALL)
    fs = fsspec.filesystem("stager", meta_url=cluster.meta_url, skip_instance_cache=True)
    fs.pipe_file(f"{ns}/r.bin", data)
    got = fs.cat_ranges([f"{ns}/r.bin", f"{ns}/r.bin", f"{ns}/none"], [0, SMALL - 3, 0],
                        [5, SMALL + 3, 1], on_error="return")
    assert got[:2] == [data[:5], data[SMALL - 3:SMALL + 3]]
    assert isinstance(got[2], FileNotFoundError)


async def test_one_decision_whole_chunk_or_batched_pieces(
        cluster: ThreadCluster, ns: str, payload: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of at least ``stream_above`` bytes that are mostly wanted go whole by
    GET; scattered small pieces go in one batched request per target; a wrong
    CRC32C on a whole chunk is caught here and counted against its target."""
    chunk = 256 * 1024
    data = payload(4 * chunk)
    whole: list[str] = []
    batches: list[int] = []
    read_chunk, batch_read = DataPlane.read_chunk_into, DataPlane.batch_read_into

    async def counting_chunk(self: DataPlane, target: str, url: str, name: str, *args: Any,
                             **kw: Any) -> Any:
        if kw.get("whole"):
            whole.append(name)
        return await read_chunk(self, target, url, name, *args, **kw)

    async def counting_batch(self: DataPlane, target: str, url: str, items: Any, out: Any,
                             **kw: Any) -> Any:
        batches.append(len(items))
        return await batch_read(self, target, url, items, out, **kw)

    monkeypatch.setattr(DataPlane, "read_chunk_into", counting_chunk)
    monkeypatch.setattr(DataPlane, "batch_read_into", counting_batch)
    async with AsyncClient(cluster.meta_url) as c:
        await c.pipe(f"{ns}/w.bin", data, layout=LayoutSpec(chunk_size=chunk, stripe_count=1))
        info = await c.stat(f"{ns}/w.bin")
        fetcher = Fetcher(c, [info])
        offsets = list(range(0, chunk, 4096)) + [2 * chunk + 100, 3 * chunk + 7000]
        got = await fetcher.fetch(Spans.of((0, o, 100) for o in offsets))
        assert got == [data[o:o + 100] for o in offsets]
        assert len(whole) == 0 and batches == [3]       # one run per chunk (merge_gap)
        batches.clear()
        opts = ReadOptions(stream_above=chunk)
        fetcher = Fetcher(c, [info], opts)
        got = await fetcher.fetch(Spans.of((0, o, 3000) for o in range(0, chunk, 3500)))
        assert b"".join(got) == b"".join(data[o:o + 3000] for o in range(0, chunk, 3500))
        assert len(whole) == 1 and batches == []         # 85 % of chunk 0: GET it whole
        bad = replace(info, checksums=(0, *info.checksums[1:]))   # type: ignore[misc]
        assert info.layout is not None
        before = c.plane.counter(info.layout.targets[0]).errors
        with pytest.raises(CorruptChunk):
            await Fetcher(c, [bad], opts).fetch(Spans.of([(0, 0, chunk)]))
        assert c.plane.counter(info.layout.targets[0]).errors > before
