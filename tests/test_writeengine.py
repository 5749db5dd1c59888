"""The one write engine (stager/dataplane/writeplan.py + writeengine.py).

The plan alone (pure), then the executor against real data servers: how copies
are grouped into requests, and a data server that dies in the middle of a
batched write (``write_many``) and of a streamed one (``open("wb")``), both
routed around by the same reroute loop, every chunk left on every replica of
the layout the file was committed with.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import start_cluster

from stager import AsyncClient
from stager.checksum import crc32c
from stager.config import load_config
from stager.dataplane import writeengine
from stager.dataplane.writeengine import WriteEngine, WriteOptions
from stager.dataplane.writeplan import Placement, WritePlan, cut
from stager.errors import TargetUnavailable
from stager.layout import chunk_targets
from stager.protocol.models import FileInfo, Layout, LayoutSpec, chunk_id
from stager.testing import ThreadCluster

KiB = 1024


def layout(*targets: str, replicas: int = 2, chunk_size: int = 4) -> Layout:
    return Layout(chunk_size, len(targets), replicas, targets,
                  tuple(f"node-{t}" for t in targets))


# -- the plan -----------------------------------------------------------------------------
def test_a_plan_cuts_files_and_wants_every_replica_grouped_by_target() -> None:
    plan = WritePlan()
    a, b = layout("t0", "t1", "t2"), layout("t2", "t0", "t1", replicas=1)
    plan.add_uploads([Placement("fa", a, {}), Placement("fb", b, {})])
    pieces = [cut(b"0123456789", 4), cut(b"xyz", 4)]
    assert [bytes(p) for p in pieces[0]] == [b"0123", b"4567", b"89"]
    rows = plan.add([0, 0, 0, 1], [0, 1, 2, 0], [*pieces[0], *pieces[1]])
    assert plan.index[rows].tolist() == [0, 1, 2, 0]
    assert plan.length[rows].tolist() == [4, 4, 2, 3]
    assert plan.checksums() == [(crc32c(b"0123"), crc32c(b"4567"), crc32c(b"89")),
                                (crc32c(b"xyz"),)]
    assert plan.name(3) == chunk_id("fb", 0)

    copies, targets = plan.missing(rows)
    want = sorted((plan.targets[t], int(r)) for r, t in zip(copies, targets, strict=True))
    expected = sorted([(t, r) for r in range(3) for t in chunk_targets(a, r)] + [("t2", 3)])
    assert want == expected
    names = [plan.targets[t] for t in targets.tolist()]
    assert names == sorted(names, key=plan.targets.index)       # grouped by target

    plan.placed[rows, plan.targets.index("t2")] = True
    copies, targets = plan.missing(rows)
    assert "t2" not in {plan.targets[t] for t in targets.tolist()}
    assert 3 not in copies.tolist()                                # fb: stored whole


def test_a_failed_upload_wants_nothing_more() -> None:
    plan = WritePlan()
    plan.add_uploads([Placement("fa", layout("t0", "t1"), {}),
                      Placement("fb", layout("t1", "t0"), {})])
    rows = plan.add([0, 1], [0, 0], cut(b"abcdefgh", 4))
    plan.fail(0, TargetUnavailable("gone"))
    plan.fail(0, TargetUnavailable("later"))                       # the first one stays
    assert str(plan.uploads[0].error) == "gone"
    assert set(plan.missing(rows)[0].tolist()) == {1}


def test_a_reroute_hands_back_the_stored_rows_that_miss_a_copy_now() -> None:
    plan = WritePlan()
    plan.add_uploads([Placement("fa", layout("t0", "t1", "t2"), {"t0": "u0"})])
    rows = plan.add([0] * 4, range(4), cut(bytes(16), 4))
    for r in rows.tolist():                   # rows 0-2 stored on all their replicas
        for t in chunk_targets(plan.uploads[0].layout, r):
            plan.placed[r, plan.targets.index(t)] = r < 3
    plan.busy[:3] = False                     # row 3 is still held by a store call
    stale = plan.reroute(0, "t1", layout("t0", "t3", "t2"), {"t3": "u3"})
    # chunks 0 (t0, t1) and 1 (t1, t2) had a copy on t1; chunk 2 (t2, t0) did not
    assert stale.tolist() == [0, 1]
    assert plan.busy[stale].all()            # now held by the caller
    assert plan.uploads[0].rerouted == ["t1"]
    assert plan.uploads[0].locations == {"t0": "u0", "t3": "u3"}
    copies, targets = plan.missing(rows)
    assert {(int(r), plan.targets[t]) for r, t in zip(copies, targets, strict=True)} == {
        (0, "t3"), (1, "t3"), (3, "t3"), (3, "t0")}


# -- the executor, against real data servers --------------------------------------------------
class Spy:
    """Records the chunk requests the engine makes on a plane (they still go to the
    servers): chunk batches through the plane, single chunks through the raw PUT's
    seam (:mod:`stager.dataplane.rawput`, which falls back to the plane's)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, plane: Any) -> None:
        self.calls: list[tuple[str, str, int]] = []      # (kind, target, chunks)
        self.out = self.most = 0
        monkeypatch.setattr(plane, "put_chunks", self.wrap("put_chunks", plane.put_chunks))
        one = self.wrap("put_chunk", functools.partial(writeengine.put_chunk, plane))
        monkeypatch.setattr(writeengine, "put_chunk", lambda _, *args, **kw: one(*args, **kw))

    def wrap(self, kind: str, real: Any) -> Any:
        async def call(target: str, url: str, *args: Any, **kw: Any) -> None:
            self.calls.append((kind, target, len(args[0]) if kind == "put_chunks" else 1))
            self.out += 1
            self.most = max(self.most, self.out)
            try:
                await real(target, url, *args, **kw)
            finally:
                self.out -= 1
        return call


async def stored_everywhere(c: AsyncClient, info: FileInfo, body: bytes) -> None:
    """Every chunk of ``info`` on every replica its layout names, byte-exact."""
    assert info.layout is not None and info.file_id is not None
    for index, piece in enumerate(cut(body, info.layout.chunk_size)):
        for target in chunk_targets(info.layout, index):
            out = memoryview(bytearray(piece.nbytes))
            crc = await c.plane.read_chunk_into(target, info.locations[target],
                                                chunk_id(info.file_id, index), 0, out,
                                                whole=True)
            assert crc == crc32c(piece) and out == piece, (target, index)


async def test_copies_go_one_request_per_target_batched_and_bounded(
        aclient: AsyncClient, ns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = LayoutSpec(chunk_size=64 * KiB, replicas=2)
    bodies = [os.urandom(1000 + i) for i in range(12)] + [os.urandom(128 * KiB)]
    plan = WritePlan()
    for i in range(len(bodies)):
        file_id, writer = await aclient.create(f"{ns}/f{i}", layout=spec)
        plan.add_uploads([Placement(file_id, writer.layout, writer.locations)])
    pieces = [cut(b, spec.chunk_size) for b in bodies]
    rows = plan.add([k for k, p in enumerate(pieces) for _ in p],
                    [i for p in pieces for i in range(len(p))], [c for p in pieces for c in p])
    spy = Spy(monkeypatch, aclient.plane)
    await WriteEngine(aclient.plane, plan, asyncio.Semaphore(2),
                      options=WriteOptions(batch_bytes=64 * KiB)).store(rows)

    assert all(u.error is None for u in plan.uploads)
    assert not plan.busy.any() and all(d is None for d in plan.data)   # bytes let go of
    assert spy.most <= 2
    # each target: the small chunks in one batch, each 64 KiB chunk alone (a PUT)
    per_target: dict[str, list[tuple[str, int]]] = {}
    for kind, target, n in spy.calls:
        per_target.setdefault(target, []).append((kind, n))
    for target, calls in per_target.items():
        assert all(n == 1 for kind, n in calls if kind == "put_chunk"), target
        assert sum(kind == "put_chunks" for kind, _ in calls) <= 1, calls
    assert sum(n for _, _, n in spy.calls) == 2 * (12 + 2)
    for k, body in enumerate(bodies):
        up = plan.uploads[k]
        info = FileInfo(path="", type="file", size=len(body), file_id=up.file_id,
                        layout=up.layout, locations=up.locations)
        await stored_everywhere(aclient, info, body)
        await aclient.abort(up.file_id)


@pytest.fixture
def private(tmp_path: Path, slow_callbacks: Any) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path, 4)
    yield c
    c.stop()


def reroutes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The targets the engine routed around (its one reroute loop, whoever called)."""
    seen: list[str] = []
    real = WriteEngine._route_around

    async def spy(self: WriteEngine, target: str, exc: Any) -> np.ndarray:
        seen.append(target)
        return await real(self, target, exc)

    monkeypatch.setattr(WriteEngine, "_route_around", spy)
    return seen


def victim_of(cluster: ThreadCluster, target: str) -> int:
    return next(i for i in range(cluster.n) if cluster.target_id(i) == target)


CONFIG = {"write_retries": 0, "retries": 0, "connect_timeout": 1}


async def test_a_server_dying_in_the_middle_of_write_many_is_routed_around(
        private: ThreadCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("stager.client.bulk.CHUNK_BATCH_BYTES", 8 * KiB)
    seen = reroutes(monkeypatch)
    items = {f"/many/f{i:02d}": os.urandom(3000 + i) for i in range(40)}
    config = load_config({**CONFIG, "client_concurrency": 1}, env={})   # one at a time
    async with AsyncClient(private.meta_url, config=config) as c:
        victim = private.target_id(1)
        plane = c.plane
        real = plane.put_chunks
        stored_on_victim = 0

        async def dies_after_two(target: str, url: str, chunks: Any) -> None:
            nonlocal stored_on_victim
            if target == victim and stored_on_victim == 2:
                await asyncio.to_thread(private.stop_data, 1)
            await real(target, url, chunks)
            stored_on_victim += target == victim

        monkeypatch.setattr(plane, "put_chunks", dies_after_two)
        results = await c.write_many(items.items(), layout=LayoutSpec(replicas=2))
        assert stored_on_victim == 2                 # two of its batches were stored
        assert set(seen) == {victim}
        for (path, body), info in zip(items.items(), results, strict=True):
            assert isinstance(info, FileInfo), info
            assert info.layout is not None and victim not in info.layout.targets
            assert await c.cat(path) == body
            await stored_everywhere(c, info, body)


async def test_a_server_dying_in_the_middle_of_a_stream_is_routed_around(
        private: ThreadCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = reroutes(monkeypatch)
    spec = LayoutSpec(chunk_size=64 * KiB, replicas=2, stripe_count=4)
    body = os.urandom(24 * 64 * KiB + 777)
    async with AsyncClient(private.meta_url, config=load_config(CONFIG, env={})) as c:
        f = await c.open("/stream.bin", "wb", layout=spec)
        half = len(body) // 2
        await f.write(body[:half])
        writer = f.writer  # type: ignore[union-attr]
        await writer.flush()                   # the first half stored on every replica
        victim = writer.layout.targets[0]
        await asyncio.to_thread(private.stop_data, victim_of(private, victim))
        await f.write(body[half:])
        await f.close()
        assert writer.rerouted == [victim] and set(seen) == {victim}
        info = await c.stat("/stream.bin", cached=False)
        assert info.layout is not None and victim not in info.layout.targets
        assert await c.cat("/stream.bin") == body
        await stored_everywhere(c, info, body)  # the first half copied from its replicas


async def test_a_small_file_on_a_dead_server_is_routed_around_asking_it_once(
        private: ThreadCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone chunk of one copy goes out without a plan (StripedWriter._store_alone);
    its failure goes to the engine's reroute loop as the engine's own request would:
    the dead target is routed around, not asked again."""
    seen = reroutes(monkeypatch)
    victim = private.target_id(2)
    await asyncio.to_thread(private.stop_data, 2)
    spec = LayoutSpec(chunk_size=64 * KiB, replicas=1, stripe_count=1)
    async with AsyncClient(private.meta_url, config=load_config(CONFIG, env={})) as c:
        spy = Spy(monkeypatch, c.plane)
        for i in range(40):                   # until a file is placed on the dead server
            body = os.urandom(1000 + i)
            f = await c.open(f"/small{i}.bin", "wb", layout=spec)
            writer = f.writer  # type: ignore[union-attr]
            first = writer.layout.targets[0]
            await f.write(body)
            await f.close()
            assert await c.cat(f"/small{i}.bin") == body
            if first == victim:
                break
        assert first == victim, "no file was placed on the dead server"
        assert writer.rerouted == [victim] and seen == [victim]
        assert [t for _, t, _ in spy.calls].count(victim) == 1
        info = await c.stat(f"/small{i}.bin", cached=False)
        assert info.layout is not None and victim not in info.layout.targets
        await stored_everywhere(c, info, body)


def test_the_writer_and_write_many_share_the_engine_decisions() -> None:
    """Each decision of a write is made in one place: the engine defines them, and no
    other module of the package defines a function or a table of the same name."""
    import ast

    from stager.client import bulk
    from stager.dataplane import writer

    decisions = {"routes_around", "only_full", "reroute_failed", "WRITE_FAILOVER",
                 "CHUNK_BATCH_BYTES", "MAX_REROUTES", "MAX_ROUNDS"}
    where: dict[str, list[str]] = {}
    for path in Path(writeengine.__file__).parents[1].rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else \
                [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
            for name in set(names) & decisions:
                where.setdefault(name, []).append(path.name)
    assert where == {name: ["writeengine.py"] for name in where}, where
    assert set(where) >= {"routes_around", "only_full", "reroute_failed", "WRITE_FAILOVER"}
    assert bulk.WriteEngine is writer.WriteEngine is writeengine.WriteEngine
