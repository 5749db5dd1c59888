"""Fault 5b: writes while a node is cut off, and what it holds when it comes back.

Three emulated nodes (network namespaces, :mod:`stager.testing.nodes`), two
replicas.  A node's link is taken down; at once, before the heartbeat timeout
could notice, files are written, one is overwritten and one deleted.  The
writes route around the silent node (after ``write_timeout``: its packets go
nowhere, nothing is refused).  When the link comes back the node rejoins, and
nothing it held is served stale: the overwritten file reads its new bytes, the
old file's and the deleted file's chunks are collected on that node, and fsck
is clean.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
from reliability_util import target_roots

from faults.test_partition import link, states, wait_state
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
# The heartbeat timeout is longer than the writes below take: only the writers'
# own reports take the cut-off node out of their layouts.
ENV = {"STAGER_HEARTBEAT_INTERVAL": "0.2", "STAGER_TARGET_TIMEOUT": "8",
       "STAGER_GC_INTERVAL": "0.2", "STAGER_FSCK_INTERVAL": "0"}


def chunks_of(root: Path, file_id: str) -> list[Path]:
    return sorted((root / "chunks").rglob(f"{file_id}.*"))


async def eventually(check: Any, timeout: float, what: str) -> None:
    start = time.monotonic()
    while not await check():
        assert time.monotonic() - start < timeout, what
        await asyncio.sleep(0.1)


async def test_writes_route_around_a_cut_off_node_which_rejoins_serving_nothing_stale(
        tmp_path: Path, figures: dict[str, Any]) -> None:
    cluster = NodeCluster(tmp_path, 3, rate_mbit=None, mode="netns", env=ENV,
                          meta_args=["--replicas", "2"])
    cluster.start()
    try:
        config = load_config({"write_timeout": 2.0, "write_retries": 0}, env={})
        async with AsyncClient(cluster.meta_url, config=config) as c:
            node1 = next(t.id for t in await c.targets() if t.node == "node1")
            old, gone = os.urandom(SMALL * 4), os.urandom(SMALL * 3)
            before = await c.pipe("/w/overwritten.bin", old, layout=LAYOUT)
            deleted = await c.pipe("/w/deleted.bin", gone, layout=LAYOUT)
            assert before.layout is not None and node1 in before.layout.targets
            link(cluster, 1, "down")
            cut = time.monotonic()
            new = os.urandom(SMALL * 5 + 7)
            written = {f"/w/new{i}.bin": os.urandom(SMALL * 3 + i) for i in range(3)}
            for path, body in written.items():
                info = await c.pipe(path, body, layout=LAYOUT)
                assert info.layout is not None and node1 not in info.layout.targets
            routed = time.monotonic() - cut
            after = await c.pipe("/w/overwritten.bin", new, layout=LAYOUT)
            assert after.layout is not None and node1 not in after.layout.targets
            await c.rm("/w/deleted.bin")
            assert (await states(c))["node1"] in ("suspect", "down")
            link(cluster, 1, "up")
            healed = time.monotonic()
            rejoined = await wait_state(c, "node1", "up", timeout=30)
            assert await c.cat("/w/overwritten.bin") == new       # never the old copy
            for path, body in written.items():
                assert await c.cat(path) == body
            assert not await c.exists("/w/deleted.bin")
            root = target_roots(tmp_path, 3)[node1]

            async def collected() -> bool:
                return not chunks_of(root, before.file_id or "") and \
                    not chunks_of(root, deleted.file_id or "")
            await eventually(collected, 30, "the old and deleted files' chunks collected "
                                            "on the node that was cut off")
            collected_after = time.monotonic() - healed
            fsck = await c.fsck()
    finally:
        cluster.stop()
    figures.update(writes_routed_around_s=round(routed, 2), rejoined_after_heal_s=round(
        rejoined, 2), stale_chunks_collected_after_heal_s=round(collected_after, 2),
        fsck_clean=fsck["clean"])
    assert fsck["clean"] and fsck["missing"] == 0, fsck

