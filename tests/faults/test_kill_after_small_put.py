"""kill -9 a server right after a small file's PUT returned: nothing acknowledged is lost.

A ``pipe`` of at most ``SMALL_FILE`` bytes is one request: the metadata server
records the upload while it writes the chunk to the data server, then commits.  The
answer must come only once all of that is done, with no work left behind it: the
metadata server killed right after the answer must have the file committed, the
data server killed right after it must have the chunk whole.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from faults.faultlib import make_bytes, read_back
from stager import AsyncClient
from stager.client.async_client import SMALL_FILE
from stager.config import load_config
from stager.testing import ProcessCluster
from stager.testing.cluster import wait_for_targets

pytestmark = pytest.mark.faults
ROUNDS = 4              # meta, data, meta, data
PER_ROUND = 10


async def test_a_small_put_survives_a_kill9_right_after_its_answer(tmp_path: Path) -> None:
    acked: dict[str, bytes] = {}
    with ProcessCluster(tmp_path, 1, restart=True) as cluster:
        for r in range(ROUNDS):
            role = "meta" if r % 2 == 0 else "data"
            async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
                for j in range(PER_ROUND):
                    path = f"/k/r{r}/f{j:02d}"
                    body = make_bytes(path, 1024 if j % 2 else SMALL_FILE)
                    await c.pipe(path, body)        # one request: create, chunk, commit
                    acked[path] = body
                pid = cluster.meta_pid() if role == "meta" else cluster.data_pid(0)
                if role == "meta":
                    cluster.kill_meta()
                else:
                    cluster.kill_data(0)
            await asyncio.to_thread(cluster.wait_restarted, role, 0, pid)
            await asyncio.to_thread(wait_for_targets, cluster.meta_url, 1)
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            nbytes, bad = await read_back(c, acked)
            listed = {e.path for r in range(ROUNDS) for e in await c.ls(f"/k/r{r}")}
            fsck = await c.fsck()
    assert bad == [], bad[:5]
    assert nbytes == sum(len(b) for b in acked.values())
    assert listed == set(acked)
    assert fsck["missing"] == 0, fsck
