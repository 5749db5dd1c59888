"""fsck: the namespace against the chunks on the targets; missing copies and orphans."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import aiohttp
import pytest
from conftest import start_cluster
from reliability_util import chunk_path, replicas_on_disk, target_roots

from stager import AsyncClient
from stager.checksum import crc32c
from stager.config import load_config
from stager.layout import chunk_targets
from stager.protocol.models import LayoutSpec, chunk_id
from stager.testing import ThreadCluster

SMALL = 64 * 1024
LAYOUT = LayoutSpec(chunk_size=SMALL, stripe_count=3, replicas=2)


@pytest.fixture
def fk(tmp_path, slow_callbacks) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path, 3, replicas=2, fsck_interval=0, orphan_grace=0.5)
    yield c
    c.stop()


def stager(meta: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
    return subprocess.run([sys.executable, "-m", "stager", "--meta", meta, *args],
                          capture_output=True, text=True, env=env, timeout=60)


async def put_stray_chunk(url: str, name: str, data: bytes) -> None:
    """A chunk no file refers to, as a write abandoned by its client leaves behind."""
    async with aiohttp.ClientSession() as s, s.put(
            f"{url}/v1/chunks/{name}", data=data,
            headers={"X-Stager-Crc32c": f"{crc32c(data):08x}"}) as r:
        assert r.status == 201


async def test_a_missing_copy_is_found_and_repaired(fk: ThreadCluster, payload) -> None:
    async with AsyncClient(fk.meta_url, config=load_config(env={})) as c:
        body = payload(SMALL * 4)
        info = await c.pipe("/f/m.bin", body, layout=LAYOUT)
        assert info.layout is not None and info.file_id is not None
        clean = await c.fsck()
        assert clean["clean"] and clean["missing"] == 0 and clean["orphans"] == 0
        assert clean["chunks_expected"] == clean["chunks_found"] == 8
        roots = target_roots(fk.root, 3)
        target = chunk_targets(info.layout, 2)[1]
        chunk_path(roots, target, chunk_id(info.file_id, 2)).unlink()
        out = await asyncio.to_thread(stager, fk.meta_url, "fsck")
        assert out.returncode == 1 and "missing: 1 (0 repaired)" in out.stdout, out.stdout
        assert f"{chunk_id(info.file_id, 2)} on {target}  (/f/m.bin)" in out.stdout
        repaired = json.loads((await asyncio.to_thread(stager, fk.meta_url, "fsck",
                                                       "--repair", "--json")).stdout)
        assert repaired["missing"] == 1 and repaired["repaired"] == 1 and repaired["clean"]
        assert replicas_on_disk(roots, info) == []
        assert (await c.fsck())["missing"] == 0


async def test_orphans_are_collected_after_the_grace_and_uploads_are_not(
        fk: ThreadCluster, payload) -> None:
    async with AsyncClient(fk.meta_url, config=load_config(env={})) as c:
        await c.pipe("/f/keep.bin", payload(SMALL * 2), layout=LAYOUT)
        # a write in progress: created, chunks stored, not committed — not an orphan
        file_id, writer = await c.create("/f/pending.bin", layout=LAYOUT)
        await writer.write(payload(SMALL * 2))
        await writer.close()
        # an abandoned write's chunk: nothing refers to it
        stray = chunk_id("ab" * 16, 0)
        await put_stray_chunk(fk.data[1].url, stray, b"stray bytes")  # type: ignore[union-attr]
        first = await c.fsck(repair=True)
        assert first["orphans"] == 1 and first["orphan_list"][0]["chunk"] == stray
        assert first["orphans_deleted"] == 0          # first seen now: within the grace
        assert first["clean"]                         # orphans are garbage, not damage
        await asyncio.sleep(0.6)
        second = await c.fsck(repair=True)
        assert second["orphans_deleted"] == 1
        assert (await c.fsck())["orphans"] == 0
        root = fk.root / "data1"
        assert not any(p.name == stray for p in (root / "chunks").rglob("*"))
        # the pending upload's chunks are all still there and commit fine
        info = await c.commit(file_id, writer)
        assert info.size == SMALL * 2 and await c.cat("/f/pending.bin") == payload(SMALL * 2)
        assert (await c.fsck())["clean"]


async def test_a_down_target_makes_fsck_not_clean(fk: ThreadCluster, payload) -> None:
    async with AsyncClient(fk.meta_url, config=load_config(env={})) as c:
        await c.pipe("/f/d.bin", payload(SMALL), layout=LAYOUT)
        await asyncio.to_thread(fk.stop_data, 2)

        async def down() -> bool:
            return any(t.state == "down" for t in await c.targets())

        while not await down():
            await asyncio.sleep(0.1)
        result = await c.fsck()
        assert not result["clean"] and result["unreachable"] == [fk.target_id(2)]
        await asyncio.to_thread(fk.start_data, 2)
