"""Writes route around a dead data server (issue: writes that survive a dead node).

Four data servers, two replicas.  A data server is killed with SIGKILL and, at
once, before any heartbeat timeout could notice (``target_timeout`` is a minute
here), a file is written through each write path.  Every write succeeds, reads
back byte-exact, and every chunk has both its verified copies on distinct
nodes, none on the dead target.  A second scenario kills a server in the middle
of a streamed write, so chunks already stored there are copied from their
surviving replica before the commit.
"""

from __future__ import annotations

import asyncio
import io
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import fsspec
import pytest
from reliability_util import replicas_on_disk, target_roots

from stager import AsyncClient, Client
from stager.config import load_config
from stager.errors import NoTargets
from stager.protocol.models import FileInfo, LayoutSpec
from stager.protocol.routes import route
from stager.stage import stage
from stager.testing import ProcessCluster
from stager.testing.mount import Mounted, fuse_unavailable

pytestmark = pytest.mark.faults
N = 4
CHUNK = 256 * 1024
SIZE = 3 * 1024 * 1024 + 12345          # 13 chunks: every slot, a short last chunk
LAYOUT = LayoutSpec(chunk_size=CHUNK, replicas=2)
# A minute: only the writer's own report can take the dead target out of new layouts.
ENV = {"STAGER_TARGET_TIMEOUT": "60", "STAGER_WRITE_RETRIES": "0"}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    with ProcessCluster(tmp_path / "c", N, replicas=2, env=ENV) as c:
        yield c


def payload(seed: int, size: int = SIZE) -> bytes:
    return random.Random(seed).randbytes(size)


def client_config() -> object:
    return load_config({"write_retries": 0, "readahead_chunks": 4}, env={})


async def check(cluster: ProcessCluster, c: AsyncClient, path: str, body: bytes,
                dead: str) -> FileInfo:
    info = await c.stat(path, cached=False)
    assert await c.cat(path) == body
    assert info.layout is not None and dead not in info.layout.targets
    assert replicas_on_disk(target_roots(cluster.root, N), info) == []
    return info


async def write_pipe(c: AsyncClient, tmp: Path, path: str, body: bytes) -> None:
    await c.pipe(path, body, layout=LAYOUT)


async def write_put(c: AsyncClient, tmp: Path, path: str, body: bytes) -> None:
    (tmp / "src.bin").write_bytes(body)
    await c.put(tmp / "src.bin", path, layout=LAYOUT)


async def write_open(c: AsyncClient, tmp: Path, path: str, body: bytes) -> None:
    f = await c.open(path, "wb", layout=LAYOUT)
    async with f:
        for pos in range(0, len(body), 100_000):
            await f.write(body[pos:pos + 100_000])


async def write_gateway(c: AsyncClient, tmp: Path, path: str, body: bytes) -> None:
    url = route("gateway_put").url(c.meta_url, path=path,
                                   query={"chunk_size": CHUNK, "replicas": 2})
    async with aiohttp.ClientSession() as s, s.put(url, data=io.BytesIO(body)) as resp:
        assert resp.status == 201, await resp.text()


async def write_stage(c: AsyncClient, tmp: Path, path: str, body: bytes) -> None:
    src = tmp / "stage-src"
    src.mkdir()
    (src / "a.bin").write_bytes(body)
    await stage(c, f"file://{src}", path + ".d", layout=LAYOUT)
    await c.rename(path + ".d/a.bin", path)


async def write_fsspec(c: AsyncClient, tmp: Path, path: str, body: bytes) -> None:
    def run() -> None:
        fs = fsspec.filesystem("stager", meta_url=c.meta_url, skip_instance_cache=True)
        with fs.open(path, "wb", layout=LAYOUT) as f:
            f.write(body)
    await asyncio.to_thread(run)


WRITERS: dict[str, Callable[[AsyncClient, Path, str, bytes], Awaitable[None]]] = {
    "pipe": write_pipe, "put": write_put, "open_wb": write_open,
    "gateway_put": write_gateway, "stage": write_stage, "fsspec_open_wb": write_fsspec,
}


@pytest.mark.parametrize("how", sorted(WRITERS))
async def test_a_write_right_after_kill9_routes_around_the_dead_server(
        cluster: ProcessCluster, tmp_path: Path, how: str) -> None:
    dead = cluster.target_id(1)
    cluster.kill_data(1)
    body = payload(len(how))
    async with AsyncClient(cluster.meta_url, config=client_config()) as c:
        await WRITERS[how](c, tmp_path, f"/{how}.bin", body)
        await check(cluster, c, f"/{how}.bin", body, dead)
        status = {t["id"]: t["state"] for t in (await c.status())["targets"]}
        assert status[dead] == "suspect"           # reported by the writer, not timed out


async def test_write_many_and_a_put_of_a_tree_route_around_the_dead_server(
        cluster: ProcessCluster, tmp_path: Path) -> None:
    dead = cluster.target_id(2)
    cluster.kill_data(2)
    small = {f"/many/f{i:03d}": payload(i, 1000 + i * 37) for i in range(60)}
    tree = tmp_path / "tree"
    for i in range(40):
        (tree / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (tree / f"d{i % 3}" / f"g{i}.bin").write_bytes(payload(100 + i, 5000 + i))
    (tree / "large.bin").write_bytes(payload(7, CHUNK * 3 + 5))
    async with AsyncClient(cluster.meta_url, config=client_config()) as c:
        results = await c.write_many(small.items(), layout=LAYOUT)
        assert all(isinstance(r, FileInfo) for r in results), results
        for path, body in small.items():
            await check(cluster, c, path, body, dead)
        await c.put(tree, "/tree", layout=LAYOUT)
        for local in tree.rglob("*.bin"):
            rel = local.relative_to(tree).as_posix()
            await check(cluster, c, f"/tree/{rel}", local.read_bytes(), dead)


async def test_stored_chunks_on_a_server_killed_mid_write_are_copied_from_their_replica(
        cluster: ProcessCluster) -> None:
    body = payload(99, 24 * CHUNK)
    async with AsyncClient(cluster.meta_url, config=client_config()) as c:
        f = await c.open("/mid.bin", "wb", layout=LayoutSpec(chunk_size=CHUNK, replicas=2,
                                                             stripe_count=4))
        half = len(body) // 2
        await f.write(body[:half])
        writer = f.writer  # type: ignore[union-attr]
        await writer.flush()                 # the first half stored on every replica
        victim = writer.layout.targets[0]
        cluster.kill_data(target_index(cluster, victim))
        await f.write(body[half:])
        await f.close()
        assert writer.rerouted == [victim]
        await check(cluster, c, "/mid.bin", body, victim)


def target_index(cluster: ProcessCluster, target: str) -> int:
    return next(i for i in range(cluster.n) if cluster.target_id(i) == target)


async def test_a_hung_server_is_routed_around_after_write_timeout(
        cluster: ProcessCluster) -> None:
    """SIGSTOP: the kernel still accepts connections, nothing answers (a hung node)."""
    pid = cluster.data_pid(2)
    hung = cluster.target_id(2)
    os.kill(pid, signal.SIGSTOP)
    try:
        config = load_config({"write_retries": 0, "write_timeout": 2.0}, env={})
        async with AsyncClient(cluster.meta_url, config=config) as c:
            body = payload(77)
            start = time.monotonic()
            await c.pipe("/hung.bin", body, layout=LAYOUT)
            took = time.monotonic() - start
            await check(cluster, c, "/hung.bin", body, hung)
            assert took < 20, took      # one write_timeout, not request_timeout per chunk
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_too_few_healthy_nodes_fail_the_write_clearly_and_show_nothing(
        cluster: ProcessCluster) -> None:
    for i in (0, 1, 2):
        cluster.kill_data(i)
    async with AsyncClient(cluster.meta_url, config=client_config()) as c:
        with pytest.raises(NoTargets, match="need 2 nodes, 1 up"):
            await c.pipe("/nope.bin", payload(5), layout=LAYOUT)
        assert not await c.exists("/nope.bin")


def test_the_cli_put_succeeds_right_after_kill9(cluster: ProcessCluster,
                                               tmp_path: Path) -> None:
    """The issue's operator scenario, word for word: ``stager put`` of 40 MB."""
    src = tmp_path / "a.bin"
    src.write_bytes(payload(40, 40_000_000))
    dead = cluster.target_id(3)
    cluster.kill_data(3)
    env = {**os.environ, "STAGER_META_URL": cluster.meta_url}
    done = subprocess.run([sys.executable, "-m", "stager", "put", str(src), "/a1.bin"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    client = Client(cluster.meta_url)
    try:
        info = client.stat("/a1.bin")
        assert info.layout is not None and dead not in info.layout.targets
        assert client.cat("/a1.bin") == src.read_bytes()
    finally:
        client.close()


@pytest.mark.fuse
@pytest.mark.skipif(fuse_unavailable() is not None, reason=f"no FUSE: {fuse_unavailable()}")
async def test_a_write_through_the_mount_right_after_kill9_routes_around(
        cluster: ProcessCluster, tmp_path: Path) -> None:
    async with AsyncClient(cluster.meta_url, config=client_config()) as c:
        await c.mkdir("/m", layout=LAYOUT)
        dead = cluster.target_id(0)
        body = payload(123)
        with Mounted(cluster.meta_url, tmp_path / "mnt") as m:
            cluster.kill_data(0)
            await asyncio.to_thread((m.mountpoint / "m" / "file.bin").write_bytes, body)
        await check(cluster, c, "/m/file.bin", body, dead)


async def test_a_put_whose_only_stored_copy_died_is_written_again_whole(
        cluster: ProcessCluster, tmp_path: Path) -> None:
    """One replica: a chunk already stored on the killed server has no copy left to
    re-copy from, so that upload cannot be finished.  The source is a local file,
    read again: the put writes the whole file again as a new upload (the policy of
    :mod:`stager.client.rewrite`, which ``pipe`` and ``write_many`` share)."""
    body = payload(5, 40 * 1024 * 1024)
    (tmp_path / "src.bin").write_bytes(body)
    roots = {i: cluster.root / f"data{i}" / "chunks" for i in range(N)}
    config = load_config({"write_retries": 2}, env={})
    async with AsyncClient(cluster.meta_url, config=config) as c:
        put = asyncio.create_task(c.put(tmp_path / "src.bin", "/again.bin",
                                        layout=LayoutSpec(chunk_size=CHUNK, replicas=1)))
        while not put.done():            # the first chunk stored anywhere: kill its server
            holder = next((i for i, d in roots.items()
                           if any(p.is_file() and not p.name.endswith(".tmp")
                                  for p in d.rglob("*"))), None)
            if holder is not None:
                cluster.kill_data(holder)
                break
            await asyncio.sleep(0.005)
        [info] = await put
        assert holder is not None, "the put ended before a chunk was stored"
        await check(cluster, c, "/again.bin", body, cluster.target_id(holder))
