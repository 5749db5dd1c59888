"""Fault 5: a node is cut off the network (its link is taken down), then healed.

The cluster runs on emulated nodes (network namespaces joined by a bridge;
:mod:`stager.testing.nodes`).  While the node is cut off, reads fail over to
the other replica within two seconds, it is marked down, and new writes go to
the nodes left.  After the link comes back it rejoins and everything converges:
every file reads back, new files use it again, fsck is clean.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from stager import AsyncClient
from stager.config import load_config
from stager.protocol.models import LayoutSpec
from stager.testing.netns import netns_unavailable
from stager.testing.nodes import NodeCluster

pytestmark = [pytest.mark.faults,
              pytest.mark.skipif(netns_unavailable() is not None,
                                 reason=f"network namespaces: {netns_unavailable()}")]
SMALL = 64 * 1024
LAYOUT = LayoutSpec(chunk_size=SMALL, replicas=2)     # striped over every healthy target
ENV = {"STAGER_HEARTBEAT_INTERVAL": "0.2", "STAGER_TARGET_TIMEOUT": "2",
       "STAGER_GC_INTERVAL": "0.2", "STAGER_FSCK_INTERVAL": "0"}


def link(cluster: NodeCluster, i: int, state: str) -> None:
    assert cluster.fabric is not None
    subprocess.run(["ip", "link", "set", cluster.fabric.nodes[i].host_if, state], check=True)


async def states(c: AsyncClient) -> dict[str, str]:
    return {t.node: t.state for t in await c.targets()}


async def wait_state(c: AsyncClient, node: str, want: str, timeout: float = 20) -> float:
    start = time.monotonic()
    while (await states(c)).get(node) != want:
        assert time.monotonic() - start < timeout, f"{node} never became {want}"
        await asyncio.sleep(0.05)
    return time.monotonic() - start


async def test_a_partitioned_node_is_read_around_and_rejoins(
        tmp_path: Path, figures: dict[str, Any]) -> None:
    cluster = NodeCluster(tmp_path, 3, rate_mbit=None, mode="netns", env=ENV,
                          meta_args=["--replicas", "2"])
    cluster.start()
    try:
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            data = {f"/p/a{i}.bin": os.urandom(SMALL * 3 + i) for i in range(9)}
            for path, body in data.items():
                await c.pipe(path, body, layout=LAYOUT)
            for path, body in data.items():               # warm: keep-alive connections
                assert await c.cat(path) == body
            link(cluster, 1, "down")
            cut = time.monotonic()
            latencies = []
            for path, body in data.items():
                start = time.monotonic()
                assert await c.cat(path) == body
                latencies.append(time.monotonic() - start)
            await wait_state(c, "node1", "down")
            marked_down = time.monotonic() - cut
            during = {f"/p/b{i}.bin": os.urandom(SMALL * 2 + i) for i in range(4)}
            for path, body in during.items():
                info = await c.pipe(path, body, layout=LAYOUT)
                assert info.layout is not None and "node1" not in info.layout.nodes
            data.update(during)
            link(cluster, 1, "up")
            healed = time.monotonic()
            rejoined = await wait_state(c, "node1", "up")
            after = {f"/p/c{i}.bin": os.urandom(SMALL * 3) for i in range(3)}
            for path, body in after.items():
                info = await c.pipe(path, body, layout=LAYOUT)
                assert info.layout is not None and "node1" in info.layout.nodes
            data.update(after)
            for path, body in data.items():
                assert await c.cat(path) == body
            converged = time.monotonic() - healed
            fsck = await c.fsck()
    finally:
        cluster.stop()
    figures.update(first_read_after_cut_s=round(latencies[0], 3),
                   worst_read_during_partition_s=round(max(latencies), 3),
                   marked_down_after_s=round(marked_down, 2),
                   rejoined_after_heal_s=round(rejoined, 2),
                   converged_after_heal_s=round(converged, 2),
                   files=len(data), fsck_clean=fsck["clean"])
    assert max(latencies) <= 2.0
    assert fsck["clean"] and fsck["missing"] == 0, fsck
