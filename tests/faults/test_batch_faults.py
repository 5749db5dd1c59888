"""Batched writes under faults: kill -9 of data servers, and an fsync that fails.

``AsyncClient.write_many`` sends each batch's chunks as one request per target
(``POST /v1/write``) and commits the batch in one metadata transaction.  A file it
reports written must read back byte-exact with every replica durable; a file it
reports failed must not be visible; a killed data server leaves at most
temporary files, which its restart removes.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from reliability_util import eventually, replicas_on_disk, target_roots

from faults.faultlib import SMALL, DataKiller, make_bytes, read_back, seconds
from faults.test_full_disk_and_eio import FSYNC_EIO, chunk_files
from stager import AsyncClient, Client
from stager.config import load_config
from stager.errors import StagerError, StorageError
from stager.protocol.models import LayoutSpec
from stager.testing import ProcessCluster, ThreadCluster

pytestmark = pytest.mark.faults
WRITERS = 2
BATCH = 40


async def test_kill9_during_batched_writes_loses_no_acked_file(
        tmp_path: Path, figures: dict[str, Any]) -> None:
    duration = seconds("batch_kill", 8)
    rng = random.Random(7)
    acked: dict[str, bytes] = {}
    failed: list[str] = []
    stop = asyncio.Event()
    layout = LayoutSpec(chunk_size=SMALL, replicas=2)
    with ProcessCluster(tmp_path, 3, replicas=2, restart=True) as cluster:
        async def writer(w: int) -> None:
            async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
                j = 0
                while not stop.is_set():
                    items = [(f"/w{w}/b{j:04d}/f{k:02d}", make_bytes(f"{w}.{j}.{k}",
                                                                   rng.randint(0, 2 * SMALL)))
                             for k in range(BATCH)]
                    try:
                        results = await c.write_many(items, layout=layout)
                    except (StagerError, OSError) as exc:   # the batch as a whole
                        failed.extend(f"{p}: {type(exc).__name__}" for p, _ in items)
                        results = [exc] * len(items)
                    for (path, data), result in zip(items, results, strict=True):
                        if isinstance(result, Exception):
                            failed.append(path)
                        else:
                            acked[path] = data
                    j += 1

        killer = DataKiller(cluster, 2.0, rng)
        tasks = [asyncio.ensure_future(writer(w)) for w in range(WRITERS)]
        tasks.append(asyncio.ensure_future(killer.run(stop)))
        await asyncio.sleep(duration)
        stop.set()
        await asyncio.gather(*tasks)

        roots = target_roots(tmp_path, 3)
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            nbytes, bad = await read_back(c, acked)
            missing = [p for path in acked
                       for p in replicas_on_disk(roots, await c.stat(path, cached=False))]
            visible_failed = [p for p in set(failed) - set(acked) if await c.exists(p)]

        def no_temporaries() -> bool:
            # every killed server was restarted (which sweeps them); no write is in flight
            return not [p for r in roots.values() for p in (r / "chunks").rglob("*.tmp")]

        eventually(no_temporaries, 10, "temporary files swept")
    figures.update(seconds=duration, kills=killer.kills, acked_files=len(acked),
                   failed_files=len(set(failed)), acked_bytes_read_back=nbytes,
                   bad_reads=len(bad), replica_problems=len(missing))
    assert killer.kills >= 1
    assert len(acked) > 2 * BATCH                       # batches went on between the kills
    assert bad == [], bad[:5]
    assert missing == [], missing[:5]
    assert visible_failed == [], visible_failed[:5]


def test_an_fsync_eio_fails_the_batch_and_keeps_nothing(tmp_path: Path, slow_callbacks,
                                                        figures: dict[str, Any]) -> None:
    cluster = ThreadCluster(tmp_path, 0, fsck_interval=0)
    cluster.start()
    root = tmp_path / "fiu-data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
    proc = subprocess.Popen(
        ["fiu-run", "-x", sys.executable, "-m", "stager", "--meta", cluster.meta_url, "data",
         "--root", str(root), "--port", "0", "--node", "n0", "--ready-file",
         str(root / "server.json")],
        env={**env, "STAGER_HEARTBEAT_INTERVAL": "0.2"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        eventually((root / "server.json").exists, 30, "the fiu-run data server")
        cluster.wait_targets(1)
        pid = json.loads((root / "server.json").read_text())["pid"]
        config = load_config({"write_retries": 0}, env={})
        with Client(cluster.meta_url, config=config) as c:
            first = c.write_many([(f"/eio/before{i}", b"b" * (i + 1)) for i in range(5)])
            assert not any(isinstance(r, Exception) for r in first)
            before = set(chunk_files(root))
            subprocess.run(["fiu-ctrl", "-c", FSYNC_EIO, str(pid)], check=True)
            time.sleep(0.2)
            items = [(f"/eio/during{i}", os.urandom(3 * SMALL)) for i in range(6)]
            during = c.write_many(items, layout=LayoutSpec(chunk_size=SMALL))
            left = set(chunk_files(root)) - before
            subprocess.run(["fiu-ctrl", "-c", "disable name=posix/io/sync/fsync", str(pid)],
                           check=True)
            time.sleep(0.2)
            # The one target failed its fsync: the write found no other node to route
            # to; the error is the target's EIO, naming both.
            assert all(isinstance(r, StorageError) and r.errno == 5 and
                       "need 1 node, 0 up" in str(r) for r in during), during
            assert not any(c.exists(p) for p, _ in items)
            # Suspect after the failed writes: no new layouts on it for target_timeout.
            eventually(lambda: all(t.up for t in c.targets()), 30, "the target up again")
            after = c.write_many([(f"/eio/after{i}", b"a" * (i + 1)) for i in range(5)])
            assert not any(isinstance(r, Exception) for r in after)
            assert [c.cat(f"/eio/before{i}") for i in range(5)] == [
                b"b" * (i + 1) for i in range(5)]
        figures.update(failed_files=len(during), chunk_files_left=len(left))
        assert left == set()                       # nothing kept, not even a temporary
    finally:
        proc.terminate()
        proc.wait(10)
        cluster.stop()
