"""Acks that prove storage (issue 26): a target that acknowledges without storing.

A real cluster (three data servers on node0..node2) plus a real extra aiohttp
server, started here, that registers itself as a target and heartbeats as
stager/data/registration.py does, and answers every chunk PUT and chunk batch
with a 2xx while storing nothing: ``200 {}``, or a well-formed ack whose
CRC32C is not the one sent.  It sits in every layout (stripe count 0: every
healthy target).  Every write that returns success must read back
byte-exact, each copy its committed layout names must be really stored on
its target, and no chunk may be counted on the liar; where no other target
is left, the write fails with a clear error and nothing becomes visible.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import fsspec
import pytest
from aiohttp import web
from conftest import raw_http, start_cluster

from stager import AsyncClient
from stager.checksum import crc32c, from_hex, to_hex
from stager.config import load_config
from stager.dataplane.ack import prove, prove_batch, prove_put
from stager.dataplane.writeengine import routes_around
from stager.errors import StagerError, StorageError
from stager.layout import chunk_targets
from stager.protocol import headers as H
from stager.protocol.batch import split_chunk_batch
from stager.protocol.messages import ChunkBatchStored, ChunkStored, Health, Heartbeat
from stager.protocol.models import FileInfo, LayoutSpec, TargetInfo, chunk_id
from stager.protocol.routes import route
from stager.testing import ThreadCluster

CHUNK = 64 << 10
LIAR = "t-liar"
LIES = ("empty", "wrong_crc")


class LyingTarget:
    """A target that says it stored what it never did.  Runs its own loop in a
    thread; registers at ``meta_url`` and heartbeats every 0.1 s."""

    def __init__(self, meta_url: str, lie: str, target_id: str = LIAR,
                 node: str = "node9") -> None:
        self.meta_url, self.lie, self.id, self.node = meta_url, lie, target_id, node
        self.writes = 0              # chunk PUTs and chunk batches answered
        self.url = ""
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="liar", daemon=True)

    def start(self) -> LyingTarget:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(15)
        return self

    def stop(self) -> None:
        if self.url:
            asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _start(self) -> None:
        app = web.Application(client_max_size=256 << 20)
        app.router.add_put("/v1/chunks/{chunk}", self.put_chunk)
        app.router.add_post("/v1/write", self.batch_write)
        app.router.add_get("/v1/chunks/{chunk}", self.nothing)
        app.router.add_post("/v1/read", self.nothing)
        app.router.add_delete("/v1/chunks/{chunk}", self.delete_chunk)
        app.router.add_post("/v1/purge", self.purge)
        app.router.add_get("/v1/health", self.health)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        self.session = aiohttp.ClientSession()
        await self._register()
        self.beating = asyncio.ensure_future(self._heartbeat())

    async def _stop(self) -> None:
        self.beating.cancel()
        await self.session.close()
        await self.runner.cleanup()

    async def _register(self) -> None:
        info = TargetInfo(self.id, self.node, self.url, capacity=1 << 40)
        async with self.session.post(route("register_target").url(self.meta_url),
                                     json=info.to_json()) as resp:
            assert resp.status < 300, await resp.text()

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            async with self.session.post(
                    route("heartbeat").url(self.meta_url, target_id=self.id),
                    json=Heartbeat(1 << 40, 0, 0, 0, 0).to_json()) as resp:
                if resp.status == 404:
                    await self._register()

    async def delete_chunk(self, request: web.Request) -> web.Response:
        return web.json_response({"deleted": False})

    async def purge(self, request: web.Request) -> web.Response:
        return web.json_response({"removed": 0})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response(Health("data", "0", self.id, self.node).to_json())

    async def put_chunk(self, request: web.Request) -> web.Response:
        data = await request.read()
        self.writes += 1
        if self.lie == "empty":
            return web.json_response({}, status=200)
        crc = from_hex(request.headers[H.CRC32C]) ^ 1
        return web.json_response(
            ChunkStored(request.match_info["chunk"], len(data), crc).to_json(), status=201)

    async def batch_write(self, request: web.Request) -> web.Response:
        pieces = split_chunk_batch(await request.read())
        self.writes += 1
        if self.lie == "empty":
            return web.json_response({}, status=200)
        acks = tuple(ChunkStored(i.chunk, len(d), i.crc ^ 1) for i, d in pieces)
        return web.json_response(ChunkBatchStored(len(pieces), sum(len(d) for _, d in pieces),
                                                  acks).to_json(), status=201)

    async def nothing(self, request: web.Request) -> web.Response:
        return web.json_response({"error": "chunk_not_found", "message": "nothing here"},
                                 status=404)


def liar_state(meta_url: str, target_id: str = LIAR) -> str:
    reply = raw_http(meta_url, "GET", route("list_targets").target())
    return next(t["state"] for t in reply.json()["targets"] if t["id"] == target_id)


def wait_liar_up(meta_url: str, timeout: float = 20) -> None:
    """The liar back in new layouts (a report made it suspect for target_timeout)."""
    deadline = time.monotonic() + timeout
    while liar_state(meta_url) != "up":
        assert time.monotonic() < deadline, "the liar never came back up"
        time.sleep(0.05)


@pytest.fixture(scope="module", params=LIES)
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          slow_callbacks: object) -> Iterator[tuple[ThreadCluster, LyingTarget]]:
    """Three real data servers and one liar (telling the lie of the parameter)."""
    cluster = start_cluster(tmp_path_factory.mktemp("liar"), 3, target_timeout=1.5)
    liar = LyingTarget(cluster.meta_url, request.param)
    try:
        liar.start()
        cluster.wait_targets(4)
        yield cluster, liar
    finally:
        liar.stop()
        cluster.stop()


def sizes(n: int, seed: int) -> list[int]:
    """File sizes around the chunk size: a chunk on every target of the stripe (so
    the liar's slot is written), empty, a byte, a chunk ± 1, and random ones."""
    rng = random.Random(seed)
    fixed = [4 * CHUNK + 3, 0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17]
    return (fixed + [rng.randrange(5 * CHUNK) for _ in range(n)])[:n]


def content(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for size in sizes(n, seed)]


def client_of(cluster: ThreadCluster) -> AsyncClient:
    return AsyncClient(cluster.meta_url, config=load_config({"chunk_size": CHUNK}, env={}))


async def make_dir(c: AsyncClient, replicas: int) -> str:
    ns = f"/liar-{uuid.uuid4().hex[:10]}"
    await c.mkdir(ns, layout=LayoutSpec(chunk_size=CHUNK, replicas=replicas))
    return ns


def check_stored(info: FileInfo, data: bytes) -> None:
    """Every copy the committed layout names is stored on its target, byte-exact;
    none is on the liar."""
    assert info.layout is not None and info.file_id is not None and info.size == len(data)
    for index in range(info.layout.chunk_count(info.size)):
        holders = chunk_targets(info.layout, index)
        assert LIAR not in holders, f"{info.path}: chunk {index} counted on the liar"
        assert len(set(holders)) == info.layout.replicas
        piece = data[index * CHUNK:(index + 1) * CHUNK]
        for target in holders:
            got = raw_http(info.locations[target], "GET",
                           route("get_chunk").target(chunk=chunk_id(info.file_id, index)))
            assert got.status == 200 and got.body == piece, (info.path, index, target)


async def check_all(c: AsyncClient, written: dict[str, bytes]) -> None:
    for path, data in written.items():
        info = await c.stat(path, cached=False)
        await asyncio.to_thread(check_stored, info, data)
        assert await c.cat(path) == data, path


def hit(liar: LyingTarget, before: int) -> None:
    """The test reached the liar (else it proved nothing)."""
    assert liar.writes > before, "no chunk write reached the liar"


# -- writes through every path ------------------------------------------------------------
@pytest.mark.parametrize("replicas", [1, 2])
async def test_pipe_put_and_the_gateway_never_count_the_liar(
        world: tuple[ThreadCluster, LyingTarget], replicas: int, tmp_path: Path) -> None:
    cluster, liar = world
    async with client_of(cluster) as c:
        ns = await make_dir(c, replicas)
        await asyncio.to_thread(wait_liar_up, cluster.meta_url)
        before = liar.writes
        piped = {f"{ns}/pipe{i}": data for i, data in enumerate(content(8, 1))}
        infos = await asyncio.gather(*(c.pipe(p, d) for p, d in piped.items()))
        assert [i.path for i in infos] == list(piped)
        hit(liar, before)

        await asyncio.to_thread(wait_liar_up, cluster.meta_url)
        before = liar.writes
        local = tmp_path / "tree"
        local.mkdir()
        put = {}
        for i, data in enumerate(content(10, 2)):      # small ones batched, large ones not
            (local / f"f{i}").write_bytes(data)
            put[f"{ns}/tree/f{i}"] = data
        await c.put(local, f"{ns}/tree")
        hit(liar, before)

        await asyncio.to_thread(wait_liar_up, cluster.meta_url)
        before = liar.writes
        # curl -T: the metadata server writes; a chunk on every target of the stripe.
        gateway = {f"{ns}/curl{i}": random.Random(i).randbytes(4 * CHUNK + i)
                   for i in range(3)}
        for path, data in gateway.items():
            reply = await asyncio.to_thread(raw_http, cluster.meta_url, "PUT",
                                            route("gateway_put").target(path=path), data)
            assert reply.status == 201, reply.body
        hit(liar, before)
        await check_all(c, {**piped, **put, **gateway})


@pytest.mark.parametrize("replicas", [1, 2])
async def test_write_many_never_counts_the_liar(
        world: tuple[ThreadCluster, LyingTarget], replicas: int) -> None:
    cluster, liar = world
    async with client_of(cluster) as c:
        ns = await make_dir(c, replicas)
        await asyncio.to_thread(wait_liar_up, cluster.meta_url)
        before = liar.writes
        items = {f"{ns}/m{i}": data for i, data in enumerate(content(30, 4))}
        results = await c.write_many(list(items.items()))
        failed = [r for r in results if isinstance(r, StagerError)]
        assert not failed, failed
        hit(liar, before)
        await check_all(c, items)


@pytest.mark.parametrize("replicas", [1, 2])
async def test_streaming_writes_never_count_the_liar(
        world: tuple[ThreadCluster, LyingTarget], replicas: int) -> None:
    cluster, liar = world
    async with client_of(cluster) as c:
        ns = await make_dir(c, replicas)
        await asyncio.to_thread(wait_liar_up, cluster.meta_url)
        before = liar.writes
        files = {f"{ns}/s{i}": data for i, data in enumerate(content(6, 5))}

        def stream() -> None:
            fs = fsspec.filesystem("stager", meta_url=cluster.meta_url, skip_instance_cache=True,
                                   config=load_config(env={}))
            # All open at once: each upload's layout names the liar before any report.
            handles = {p: fs.open(p, "wb", block_size=CHUNK // 3) for p in files}
            for step in range(0, max(map(len, files.values())) + 1, 10_000):
                for path, f in handles.items():
                    f.write(files[path][step:step + 10_000])
            for f in handles.values():
                f.close()

        await asyncio.to_thread(stream)
        hit(liar, before)
        await check_all(c, files)


# -- nowhere else to go: a clear error, nothing visible ---------------------------------------
def test_with_no_other_target_the_write_fails_and_nothing_is_visible(
        tmp_path: Path, slow_callbacks: object) -> None:
    cluster = start_cluster(tmp_path, 1, target_timeout=1.5)
    liar = LyingTarget(cluster.meta_url, "empty")

    async def attempt() -> None:
        async with client_of(cluster) as c:
            ns = await make_dir(c, 2)          # two nodes: the real one and the liar's
            for i in range(2):
                await asyncio.to_thread(wait_liar_up, cluster.meta_url)
                with pytest.raises(StorageError, match="did not prove it stored"):
                    await c.pipe(f"{ns}/p{i}", b"x" * (CHUNK + 5))
            await asyncio.to_thread(wait_liar_up, cluster.meta_url)
            [result] = await c.write_many([(f"{ns}/m", b"y" * 100)])
            assert isinstance(result, StorageError) and "did not prove" in str(result)
            assert [e.name for e in await c.ls(ns)] == []

    try:
        liar.start()
        cluster.wait_targets(2)
        asyncio.run(attempt())
        assert liar.writes >= 3
    finally:
        liar.stop()
        cluster.stop()


# -- the metadata server's own copies -------------------------------------------------------
async def test_a_rebuild_never_counts_a_copy_on_the_liar(tmp_path: Path,
                                                        slow_callbacks: object) -> None:
    """A removed target's chunks are copied back to two replicas; the liar, joined
    since, claims the most free space, and its "copies" must never be counted."""
    cluster = start_cluster(tmp_path, 3, fsck_interval=0, target_timeout=1.5)
    liar = LyingTarget(cluster.meta_url, "empty")
    try:
        async with client_of(cluster) as c:
            ns = await make_dir(c, 2)
            data = {f"{ns}/r{i}": d for i, d in enumerate(content(10, 6))}
            for path, body in data.items():
                await c.pipe(path, body)
            await asyncio.to_thread(liar.start)
            await asyncio.to_thread(cluster.wait_targets, 4)
            victim = cluster.target_id(2)
            await c.remove_target(victim)
            deadline = time.monotonic() + 90
            while True:
                infos = [await c.stat(p, cached=False) for p in data]
                if all(i.layout is not None and victim not in i.layout.targets for i in infos):
                    break
                assert time.monotonic() < deadline, "the rebuild never finished"
                await asyncio.sleep(0.2)
            hit(liar, 0)
            await asyncio.to_thread(cluster.stop_data, 2)
            await check_all(c, data)
    finally:
        liar.stop()
        cluster.stop()


# -- the real ack, on the wire --------------------------------------------------------------
def test_a_data_server_acks_the_size_and_crc32c_it_stored(cluster: ThreadCluster) -> None:
    url = cluster.data[0].url      # type: ignore[union-attr]
    fid = uuid.uuid4().hex
    data = random.Random(7).randbytes(3 * 65536 + 11)
    name = f"{fid}.0"
    put = raw_http(url, "PUT", route("put_chunk").target(chunk=name), data,
                   {H.CRC32C: to_hex(crc32c(data))})
    assert put.status == 201, put.body
    assert put.json() == {"chunk": name, "size": len(data), "crc32c": to_hex(crc32c(data))}
    head = raw_http(url, "HEAD", route("head_chunk").target(chunk=name))
    assert head.headers[H.CRC32C] == put.json()["crc32c"]          # what the file holds
    assert int(head.headers[H.CHUNK_SIZE]) == put.json()["size"]

    chunks = [(f"{fid}.{i}", random.Random(i).randbytes(i * 999)) for i in range(1, 5)]
    head_line = json.dumps({"items": [[c, len(d), to_hex(crc32c(d))] for c, d in chunks]})
    body = head_line.encode() + b"\n" + b"".join(d for _, d in chunks)
    batch = raw_http(url, "POST", route("batch_write").target(), body)
    assert batch.status == 201, batch.body
    assert batch.json()["stored"] == [
        {"chunk": c, "size": len(d), "crc32c": to_hex(crc32c(d))} for c, d in chunks]


# -- the check itself ---------------------------------------------------------------------
def test_an_ack_proves_each_chunk_with_its_size_and_crc32c() -> None:
    a, b = ChunkStored("a" * 32 + ".0", 5, 0x1234), ChunkStored("a" * 32 + ".1", 0, 0)
    prove("t0", (b, a), (a, b))                        # any order
    prove_put("t0", json.dumps(a.to_json()).encode(), a)
    prove_batch("t0", json.dumps(ChunkBatchStored(2, 5, (a, b)).to_json()).encode(), (a, b))
    lies = [
        (prove_put, b"{}", a), (prove_put, b"", a), (prove_put, b"not json", a),
        (prove_put, json.dumps(b.to_json()).encode(), a),                   # another chunk
        (prove_put, json.dumps(ChunkStored(a.chunk, 4, a.crc).to_json()).encode(), a),
        (prove_put, json.dumps(ChunkStored(a.chunk, 5, 0x1235).to_json()).encode(), a),
        (prove_batch, b"{}", (a, b)),
        (prove_batch, json.dumps(ChunkBatchStored(2, 5).to_json()).encode(), (a, b)),
        (prove_batch, json.dumps(ChunkBatchStored(2, 5, (a,)).to_json()).encode(), (a, b)),
    ]
    for check, answer, sent in lies:
        with pytest.raises(StorageError, match="target t0 did not prove") as caught:
            check("t0", answer, sent)                   # type: ignore[operator]
        assert routes_around(caught.value)              # a failed write of that target
        assert caught.value.details["target"] == "t0"


def test_a_data_servers_own_ack_is_proven_by_its_bytes(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """The ack a data server writes (compact JSON, stager/data/app.py) of exactly what
    was sent proves it without a parse; one byte off is parsed, and refused."""
    from stager.dataplane import ack
    from stager.web.middleware import encode_json

    a = ChunkStored("a" * 32 + ".0", 1024, 0x1234abcd)
    parsed: list[bytes] = []
    real = ack._json
    monkeypatch.setattr(ack, "_json", lambda answer: parsed.append(answer) or real(answer))
    prove_put("t0", encode_json(a.to_json()), a)
    assert parsed == []
    for lie in (ChunkStored(a.chunk, 1023, a.crc), ChunkStored(a.chunk, 1024, 0x1234abce),
                ChunkStored("a" * 32 + ".1", 1024, a.crc)):
        with pytest.raises(StorageError, match="target t0 did not prove"):
            prove_put("t0", encode_json(lie.to_json()), a)
    assert len(parsed) == 3
