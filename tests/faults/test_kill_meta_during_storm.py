"""Fault 6: kill -9 the metadata server during a storm of creates and renames.

``stager up --restart`` starts it again on the same root and port.  The eight
writers' creates ride it out: ``pipe`` sends again onto the restarted server, so
none fails.  Every acknowledged create and rename is there afterwards; an
operation whose answer was lost is either done or not, never half; every file
present reads back exactly what its writer wrote; fsck is clean.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from faults.faultlib import make_bytes, seconds
from stager import AsyncClient
from stager.config import load_config
from stager.errors import StagerError
from stager.protocol.models import FileInfo, LayoutSpec
from stager.testing import ProcessCluster

pytestmark = pytest.mark.faults
WORKERS = 8
KILL_EVERY = 1.5


async def test_kill9_meta_during_create_rename_storm(tmp_path: Path,
                                                     figures: dict[str, Any]) -> None:
    duration = seconds("fault6", 8)
    rng = random.Random(6)
    created: dict[str, bytes] = {}         # acknowledged creates: original path → bytes
    renamed: dict[str, str] = {}           # acknowledged renames: original → new path
    unsure: dict[str, str] = {}            # renames whose answer was lost
    errors = {"create": 0, "rename": 0}
    restarts: list[float] = []
    stop = asyncio.Event()
    with ProcessCluster(tmp_path, 3, replicas=2, restart=True) as cluster:
        async def worker(w: int) -> None:
            async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
                j = 0
                while not stop.is_set():
                    src, dst = f"/s/w{w}/f{j:05d}", f"/s/w{w}/g{j:05d}"
                    body = make_bytes(src, rng.randint(1, 200_000))
                    j += 1
                    try:
                        await c.pipe(src, body, layout=LayoutSpec(chunk_size=64 * 1024))
                        created[src] = body
                    except (StagerError, OSError):
                        errors["create"] += 1
                        continue
                    try:
                        await c.rename(src, dst)
                        renamed[src] = dst
                    except (StagerError, OSError):
                        errors["rename"] += 1
                        unsure[src] = dst

        async def killer() -> None:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), KILL_EVERY)
                    return
                except TimeoutError:
                    pass
                old = int(cluster.info["meta"]["pid"])
                cluster.kill_meta()
                restarts.append(round(await asyncio.to_thread(
                    cluster.wait_restarted, "meta", 0, old), 2))

        tasks = [asyncio.ensure_future(worker(w)) for w in range(WORKERS)]
        tasks.append(asyncio.ensure_future(killer()))
        await asyncio.sleep(duration)
        stop.set()
        await asyncio.gather(*tasks)

        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            present = {e.path: e for e in [x async for x in c.walk("/s")]}
            lost_ops, wrong = [], []
            for src in created:
                dst = renamed.get(src) or unsure.get(src)
                if src in renamed:
                    ok = dst in present and src not in present
                elif src in unsure:
                    ok = (dst in present) != (src in present)
                else:
                    ok = src in present
                if not ok:
                    lost_ops.append(src)
            # every file there is whole: exactly what its writer wrote
            for path in present:
                src = path.replace("/g", "/f")
                if await c.cat(path) != make_bytes(src, present[path].size):
                    wrong.append(path)
            fsck = await c.fsck()
    figures.update(seconds=duration, meta_kills=len(restarts), restart_seconds=restarts,
                   acked_creates=len(created), acked_renames=len(renamed),
                   unanswered_renames=len(unsure), failed_creates=errors["create"],
                   files_present=len(present), acked_ops_missing=len(lost_ops),
                   files_not_whole=len(wrong), fsck_clean=fsck["clean"],
                   fsck_missing=fsck["missing"])
    assert len(restarts) >= max(1, int(duration // (KILL_EVERY + 1.5)))
    assert len(created) > 20 and len(renamed) > 10
    assert lost_ops == [], lost_ops[:5]
    assert errors["create"] == 0        # every create retried onto the restarted server
    assert wrong == [], wrong[:5]
    assert fsck["clean"] and fsck["missing"] == 0, fsck


async def test_write_many_waits_out_a_meta_restart_as_pipe_does(tmp_path: Path) -> None:
    """Found by the history check (test_history.py): right after a kill -9 of the
    metadata server, pipe retried until ``--restart`` brought it back, but
    write_many failed whole at once, its batched create refused."""
    items = [(f"/m/f{i:02d}", make_bytes(f"m{i}", 1000 + 997 * i)) for i in range(8)]
    with ProcessCluster(tmp_path, 3, replicas=2, restart=True) as cluster:
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            old = int(cluster.info["meta"]["pid"])
            cluster.kill_meta()
            await c.pipe("/m/piped", b"p" * 5000)
            await asyncio.to_thread(cluster.wait_restarted, "meta", 0, old)
            cluster.kill_meta()
            results = await c.write_many(items, layout=LayoutSpec(chunk_size=64 * 1024))
            assert all(isinstance(r, FileInfo) for r in results), results
            for path, body in [*items, ("/m/piped", b"p" * 5000)]:
                assert await c.cat(path) == body
