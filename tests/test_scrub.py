"""Scrub: every chunk's checksums verified; a bad copy repaired from a good replica;
no good copy left is a clear error, never wrong bytes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import start_cluster
from reliability_util import (
    aeventually,
    chunk_path,
    flip_byte,
    replicas_on_disk,
    target_roots,
    truncate,
    verify_copy,
)

from stager import AsyncClient
from stager.config import load_config
from stager.errors import CorruptChunk
from stager.layout import chunk_targets
from stager.protocol.models import LayoutSpec, chunk_id
from stager.testing import ThreadCluster

SMALL = 64 * 1024
LAYOUT = LayoutSpec(chunk_size=SMALL, stripe_count=3, replicas=2)


@pytest.fixture(scope="module")
def r2(tmp_path_factory: pytest.TempPathFactory, slow_callbacks) -> Iterator[ThreadCluster]:
    """Three nodes, two replicas, a background scrub pass every half second."""
    c = start_cluster(tmp_path_factory.mktemp("scrub"), 3, replicas=2, scrub_interval=0.5,
                      fsck_interval=0)
    yield c
    c.stop()


def stager(meta: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
    return subprocess.run([sys.executable, "-m", "stager", "--meta", meta, *args],
                          capture_output=True, text=True, env=env, timeout=60)


async def repaired(c: AsyncClient, at_least: int) -> bool:
    return (await c.status())["repair"]["repaired"] >= at_least


async def test_the_background_scrubber_repairs_a_flipped_byte(r2: ThreadCluster, ns: str,
                                                              payload) -> None:
    async with AsyncClient(r2.meta_url, config=load_config(env={})) as c:
        body = payload(SMALL * 4)
        info = await c.pipe(f"{ns}/bg.bin", body, layout=LAYOUT)
        assert info.layout is not None and info.file_id is not None
        roots = target_roots(r2.root, 3)
        target = chunk_targets(info.layout, 2)[1]
        path = chunk_path(roots, target, chunk_id(info.file_id, 2))
        before = (await c.status())["repair"]["repaired"]
        flip_byte(path, 5000)
        took = await aeventually(lambda: repaired(c, before + 1), 15,
                                 "the background scrubber to repair the copy")
        print(f"scrub: a flipped byte found and repaired in the background in {took:.2f}s")
        verify_copy(chunk_path(roots, target, chunk_id(info.file_id, 2)))
        assert await c.cat(f"{ns}/bg.bin") == body


async def test_a_read_that_hits_a_bad_copy_has_it_repaired(tmp_path: Path, slow_callbacks,
                                                           payload) -> None:
    """No background pass due for a day: the read itself tells the scrubber."""
    cluster = start_cluster(tmp_path, 3, replicas=2, fsck_interval=0)
    try:
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            body = payload(SMALL * 3)
            info = await c.pipe("/s/read.bin", body, layout=LAYOUT)
            assert info.layout is not None and info.file_id is not None
            roots = target_roots(tmp_path, 3)
            primary = chunk_targets(info.layout, 1)[0]
            flip_byte(chunk_path(roots, primary, chunk_id(info.file_id, 1)), 10)
            # a ranged read: the data server checks the blocks it sends
            assert await c.cat("/s/read.bin", SMALL, SMALL + 100) == body[SMALL:SMALL + 100]
            await aeventually(lambda: repaired(c, 1), 15, "the read-triggered repair")
            verify_copy(chunk_path(roots, primary, chunk_id(info.file_id, 1)))
    finally:
        cluster.stop()


async def test_stager_scrub_repairs_flips_and_truncations(tmp_path: Path, slow_callbacks,
                                                          payload) -> None:
    cluster = start_cluster(tmp_path, 3, replicas=2, fsck_interval=0)
    try:
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            body = payload(SMALL * 6 + 7)
            info = await c.pipe("/s/cmd.bin", body, layout=LAYOUT)
            assert info.layout is not None and info.file_id is not None
            roots = target_roots(tmp_path, 3)
            damaged = []
            for index, harm in ((0, flip_byte), (3, truncate), (6, flip_byte)):
                target = chunk_targets(info.layout, index)[index % 2]
                harm(chunk_path(roots, target, chunk_id(info.file_id, index)))
                damaged.append((target, chunk_id(info.file_id, index)))
            out = await asyncio.to_thread(stager, cluster.meta_url, "scrub", "--json")
            assert out.returncode == 0, out.stderr
            result = json.loads(out.stdout)
            print(f"scrub: {result['checked']} chunks checked, {result['corrupt']} corrupt, "
                  f"{result['repaired']} repaired in {result['seconds']}s")
            assert (result["corrupt"], result["repaired"], result["unrecoverable"]) == (3, 3, 0)
            found = {(t, ch) for t, r in result["targets"].items() for ch in r["corrupt"]}
            assert found == set(damaged)
            assert replicas_on_disk(roots, await c.stat("/s/cmd.bin", cached=False)) == []
            text = await asyncio.to_thread(stager, cluster.meta_url, "scrub")
            assert text.returncode == 0 and "0 corrupt, 0 repaired" in text.stdout
    finally:
        cluster.stop()


async def test_every_copy_bad_is_a_clear_error_never_wrong_bytes(r2: ThreadCluster, ns: str,
                                                                 payload, http) -> None:
    async with AsyncClient(r2.meta_url, config=load_config(env={})) as c:
        body = payload(SMALL * 2)
        info = await c.pipe(f"{ns}/allbad.bin", body, layout=LAYOUT)
        assert info.layout is not None and info.file_id is not None
        roots = target_roots(r2.root, 3)
        name = chunk_id(info.file_id, 0)
        for target in chunk_targets(info.layout, 0):
            flip_byte(chunk_path(roots, target, name), 77)
        with pytest.raises(CorruptChunk):
            await c.cat(f"{ns}/allbad.bin")
        with pytest.raises(CorruptChunk):
            await c.cat(f"{ns}/allbad.bin", 10, 20)          # ranged: checked by the server
        assert await c.cat(f"{ns}/allbad.bin", SMALL) == body[SMALL:]   # the other chunk
        r = http(r2.meta_url, "GET", f"/v1/files{ns}/allbad.bin")
        assert r.status == 500 and r.json()["error"] == "chunk_corrupt"
        result = await c.scrub()
        assert result["unrecoverable"] == 2 and result["repaired"] == 0
    out = await asyncio.to_thread(stager, r2.meta_url, "scrub")
    assert out.returncode == 1 and "2 unrecoverable" in out.stdout


def test_a_data_server_scrub_is_rate_limited(r2: ThreadCluster, client, ns: str, payload,
                                             http) -> None:
    client.pipe(f"{ns}/rate.bin", payload(SMALL * 24), layout=LAYOUT)
    # the data server holding the most (a layout of 3 need not name data0)
    held = {i: sum(p.stat().st_size for p in (r2.root / f"data{i}" / "chunks").rglob("*.*"))
            for i in range(len(r2.data))}
    i = max(held, key=held.__getitem__)
    url, stored = r2.data[i].url, held[i]  # type: ignore[union-attr]
    assert stored >= 2 * 65536, held       # the slowest rate a scrub accepts is 64 KiB/s
    rate = stored // 2                     # about two seconds of work, one second of burst
    start = time.monotonic()
    r = http(url, "POST", "/v1/scrub", body=json.dumps({"rate": rate}).encode(),
             headers={"Content-Type": "application/json"})
    took = time.monotonic() - start
    assert r.status == 200
    lines = [json.loads(line) for line in r.body.splitlines()]
    done = lines[-1]
    assert done["done"] and done["bytes"] == stored and done["checked"] > 0
    print(f"scrub: {stored} bytes at {rate} B/s took {took:.2f}s")
    assert took >= 0.8
    bad = http(url, "POST", "/v1/scrub", body=b'{"rate": -1}',
               headers={"Content-Type": "application/json"})
    assert bad.status == 400 and bad.json()["error"] == "bad_request"
