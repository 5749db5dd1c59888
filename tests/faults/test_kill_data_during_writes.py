"""Fault 1: kill -9 a data server every few seconds during concurrent writes (R = 2).

Every acknowledged write must read back byte-exact, and every replica of every
acknowledged chunk must be on its target's disk: a write is acknowledged only
once every replica is durable.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from reliability_util import replicas_on_disk, target_roots

from faults.faultlib import SMALL, DataKiller, make_bytes, read_back, seconds
from stager import AsyncClient
from stager.config import load_config
from stager.errors import StagerError
from stager.protocol.models import LayoutSpec
from stager.testing import ProcessCluster

pytestmark = pytest.mark.faults
WRITERS = 4


async def test_kill9_data_servers_during_writes_loses_no_acked_write(
        tmp_path: Path, figures: dict[str, Any]) -> None:
    duration = seconds("fault1", 10)
    rng = random.Random(1)
    acked: dict[str, bytes] = {}
    failed: list[str] = []
    stop = asyncio.Event()
    with ProcessCluster(tmp_path, 3, replicas=2, restart=True) as cluster:
        async def writer(w: int) -> None:
            async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
                j = 0
                while not stop.is_set():
                    path = f"/w{w}/f{j:05d}.bin"
                    body = make_bytes(path, rng.randint(1, 6 * SMALL))
                    try:
                        await c.pipe(path, body, layout=LayoutSpec(chunk_size=SMALL))
                        acked[path] = body
                    except (StagerError, OSError) as exc:
                        failed.append(f"{path}: {type(exc).__name__}")
                    j += 1

        killer = DataKiller(cluster, 2.0, rng)
        tasks = [asyncio.ensure_future(writer(w)) for w in range(WRITERS)]
        tasks.append(asyncio.ensure_future(killer.run(stop)))
        await asyncio.sleep(duration)
        stop.set()
        await asyncio.gather(*tasks)

        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            nbytes, bad = await read_back(c, acked)
            roots = target_roots(tmp_path, 3)
            missing = [p for path in acked
                       for p in replicas_on_disk(roots, await c.stat(path, cached=False))]
            fsck = await c.fsck()
    figures.update(seconds=duration, kills=killer.kills, restart_seconds=killer.downtimes,
                   acked_writes=len(acked), failed_writes=len(failed),
                   acked_bytes_read_back=nbytes, bad_reads=len(bad),
                   replica_problems=len(missing), fsck_missing=fsck["missing"])
    assert killer.kills >= max(1, int(duration // 4))   # a kill every 2 s + its restart
    assert len(acked) > 10 * killer.kills            # writes went on between the kills
    assert bad == [], bad[:5]
    assert missing == [], missing[:5]
    assert fsck["missing"] == 0 and fsck["clean"], fsck
