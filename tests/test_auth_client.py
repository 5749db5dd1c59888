"""Auth as a client sees it: tokens given every way, capabilities kept and renewed.

One auth-on cluster (in-process servers) whose capabilities live 3 seconds and
whose clock grace is 0 here, so renewal is exercised in seconds, not minutes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from conftest import raw_http, start_cluster

from stager import Client
from stager.auth import cache as auth_cache
from stager.auth import tokens
from stager.client import AsyncClient
from stager.config import load_config
from stager.errors import Forbidden, Unauthenticated
from stager.loader import Loader
from stager.protocol.models import chunk_id
from stager.testing.cluster import ThreadCluster

TTL = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, slow_callbacks: object
            ) -> Iterator[ThreadCluster]:
    patch = pytest.MonkeyPatch()
    patch.setattr(tokens, "CLOCK_SKEW", 0)          # read at call time by both modules
    patch.setattr(auth_cache, "CLOCK_SKEW", 0)
    c = start_cluster(tmp_path_factory.mktemp("auth-client"), auth=True, replicas=2,
                      capability_ttl=TTL)
    yield c
    c.stop()
    patch.undo()


def client(cluster: ThreadCluster, token: str) -> Client:
    return Client(cluster.meta_url, config=load_config(env={}), token=token)


async def test_a_reader_renews_its_capabilities_and_keeps_reading(cluster: ThreadCluster,
                                                                  ns: str) -> None:
    data = bytes(range(256)) * 4096                 # 1 MiB, chunks of 64 KiB
    token = cluster.mint(["read", "write"])
    async with AsyncClient(cluster.meta_url, config=load_config(env={}), token=token) as c:
        f = await c.open(f"{ns}/f", "wb")
        await f.write(data)
        await f.close()
        reader = await c.open(f"{ns}/f")
        assert c.capabilities is not None
        first = c.capabilities.fetched
        stale = None
        deadline = time.monotonic() + 2.5 * TTL
        while time.monotonic() < deadline:          # one file, open for > 2 lifetimes
            reader.seek(0)
            assert await reader.read() == data
            stale = stale or c.capabilities.held("read", reader.info.file_id)
            await asyncio.sleep(0.3)
        assert c.capabilities.fetched > first       # renewed by the book, not by a stat
        await reader.close()
    # The first capability has expired: a data server refuses it outright.
    info = client(cluster, token).stat(f"{ns}/f")
    target = info.layout.targets[0]
    got = raw_http(info.locations[target], "GET",
                   f"/v1/chunks/{chunk_id(info.file_id, 0)}",
                   headers={"X-Stager-Capability": stale})
    assert (got.status, got.json()["error"]) == (401, "unauthenticated")
    assert got.json()["details"]["reason"] == "expired"


def test_stat_and_create_hand_out_capabilities(cluster: ThreadCluster, ns: str) -> None:
    with client(cluster, cluster.mint(["read", "write"])) as c:
        c.pipe(f"{ns}/x", b"x" * 5000)
        info = c.stat(f"{ns}/x")
        assert info.capability is not None and tokens.expires_at(info.capability) > time.time()
        assert c.aio.capabilities is not None and c.aio.capabilities.fetched == 0
    # Without auth headers a stat's answer carries none.
    with client(cluster, cluster.admin_token) as c:
        assert c.ls(ns)[0].capability is None          # listings carry no capabilities


def test_a_write_only_token_writes_and_cannot_read(cluster: ThreadCluster, ns: str) -> None:
    with client(cluster, cluster.mint(["write"], (ns,))) as c:
        c.pipe(f"{ns}/drop", b"dropped")
        with pytest.raises(Forbidden, match="'read' scope"):
            c.cat(f"{ns}/drop")
    with client(cluster, cluster.mint(["read"], (ns,))) as c:
        assert c.cat(f"{ns}/drop") == b"dropped"


def test_fsspec_and_the_loader_take_a_token(cluster: ThreadCluster, ns: str,
                                            tmp_path: Path) -> None:
    token = cluster.mint(["read", "write"], (ns,))
    fs = fsspec.filesystem("stager", meta_url=cluster.meta_url, token=token,
                           skip_instance_cache=True)
    try:
        for i in range(4):
            fs.pipe(f"{ns}/ds/{i}.bin", bytes([i]) * 1000)
        assert sorted(fs.ls(f"{ns}/ds", detail=False))[0].endswith("0.bin")
    finally:
        fs.close()
    loader = Loader(f"{ns}/ds", batch_size=2, meta_url=cluster.meta_url, token=token,
                    shuffle=False, format="files", config=load_config(env={}))
    try:
        seen = sorted(bytes(s["data"][:1]) for batch in loader for s in batch)
    finally:
        loader.close()
    assert seen == [bytes([i]) for i in range(4)]
    with pytest.raises(Unauthenticated):
        Loader(f"{ns}/ds", batch_size=2, meta_url=cluster.meta_url, token="stg1.x.y",
               config=load_config(env={}))


def test_a_restarted_data_server_trusts_the_key_again(cluster: ThreadCluster,
                                                      ns: str) -> None:
    with client(cluster, cluster.admin_token) as c:
        c.pipe(f"{ns}/r", b"r" * 70_000)
        cluster.stop_data(0)
        cluster.start_data(0)
        cluster.wait_targets(3)
        assert c.cat(f"{ns}/r") == b"r" * 70_000


async def test_concurrent_readers_fetch_each_capability_once(cluster: ThreadCluster,
                                                             ns: str) -> None:
    token = cluster.mint(["read", "write"])
    async with AsyncClient(cluster.meta_url, config=load_config(env={}), token=token) as c:
        await c.write_many([(f"{ns}/{i}", b"x") for i in range(40)])
        ids = [(await c.stat(f"{ns}/{i}")).file_id for i in range(40)]
    async with AsyncClient(cluster.meta_url, config=load_config(env={}), token=token) as c:
        book = c.capabilities
        assert book is not None
        # Four readers at once, overlapping: every file is asked for once, not per reader.
        headers = await asyncio.gather(*(book.header("read", ids[k * 10:k * 10 + 20])
                                         for k in range(4)))
        assert book.fetched == 40
        # One batch capability per fetch, each shown once however many files it names:
        # 0-19 (A), 10-19 from A and 20-29 (B), 20-29 from B and 30-39 (C), 30-39 from C.
        assert [len(h.split()) for h in headers if h] == [1, 2, 2, 1]


def test_a_loader_keeps_reading_across_capability_lifetimes(cluster: ThreadCluster,
                                                            ns: str) -> None:
    token = cluster.mint(["read", "write"], (ns,))
    with client(cluster, token) as c:
        c.write_many([(f"{ns}/d/{i:03d}", bytes([i]) * 100) for i in range(64)])
    loader = Loader(f"{ns}/d", batch_size=16, meta_url=cluster.meta_url, token=token,
                    format="files", config=load_config(env={}), report=False,
                    prefetch_next_epoch=False)     # each epoch reads after the sleep
    try:
        book = loader._client.aio.capabilities
        fetched = []
        for epoch in range(3):                      # ~2.5 capability lifetimes in all
            loader.set_epoch(epoch)
            assert sorted(s["data"][0] for b in loader for s in b) == list(range(64))
            fetched.append(book.fetched)
            time.sleep(TTL * 0.8)
        assert fetched[0] >= 64 and fetched[2] > fetched[1] > fetched[0]   # renewed
    finally:
        loader.close()
