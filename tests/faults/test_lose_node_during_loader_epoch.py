"""Fault 2: one of three nodes is lost (kill -9, never restarted) during a Loader epoch.

The epoch finishes with every sample exactly once and byte-exact, the worst
stall between batches is measured, and the rebuild brings every file back to
two replicas on distinct nodes (the two nodes left).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from loader_data import file_bytes, write_files
from reliability_util import eventually, replicas_on_disk, target_roots

from stager import Client, Loader
from stager.config import load_config
from stager.testing import ProcessCluster

pytestmark = pytest.mark.faults
SAMPLES, BATCH, KILL_AFTER = 200, 5, 6
STEP = 0.03                 # seconds of "training" per batch


def test_a_node_lost_mid_epoch_loses_no_sample_and_is_rebuilt(
        tmp_path: Path, figures: dict[str, Any]) -> None:
    env = {"STAGER_TARGET_LOST_AFTER": "1", "STAGER_FSCK_INTERVAL": "0"}
    with ProcessCluster(tmp_path, 3, replicas=2, env=env) as cluster, \
            Client(cluster.meta_url, config=load_config(env={})) as c:
        write_files(c, "/ds", SAMPLES, size=40_000)
        victim = 1
        lost = cluster.target_id(victim)
        seen: list[int] = []
        gaps: list[float] = []
        with Loader("/ds", batch_size=BATCH, meta_url=cluster.meta_url, seed=7,
                    drop_last=False, config=load_config(env={})) as loader:
            batches = iter(loader)
            killed_at = 0.0
            for n in range(10**6):
                asked = time.monotonic()
                batch = next(batches, None)           # the time a training step waits
                if killed_at:
                    gaps.append(time.monotonic() - asked)
                if batch is None:
                    break
                for s in batch:
                    i = int(s["__key__"].split("/f")[1][:4])
                    assert s["data"] == file_bytes(i, 40_000), s["__key__"]
                    seen.append(int(s["__index__"]))
                if n == KILL_AFTER:
                    cluster.kill_data(victim)
                    killed_at = time.monotonic()
                time.sleep(STEP)                      # the training step itself
            stats = loader.stats()
        epoch_after_kill = time.monotonic() - killed_at
        took = eventually(
            lambda: c.status()["rebuild"]["passes"] >= 1
            and c.status()["rebuild"]["state"] == "idle", 60, "the rebuild")
        rebuild = c.status()["rebuild"]
        roots = target_roots(tmp_path, 3)
        problems = []
        for info in c.walk("/ds"):
            assert info.layout is not None and lost not in info.layout.targets
            problems += replicas_on_disk(roots, info)
        fsck = c.fsck()
    figures.update(samples=SAMPLES, delivered=len(seen), distinct=len(set(seen)),
                   worst_stall_s=round(max(gaps), 3), median_wait_s=round(
                       sorted(gaps)[len(gaps) // 2], 4),
                   epoch_rest_after_kill_s=round(epoch_after_kill, 2),
                   errors_on_lost_target=stats["targets"].get(lost, {}).get("errors"),
                   rebuild_files=rebuild["files_done"], rebuild_bytes=rebuild["bytes_copied"],
                   rebuild_done_after_s=round(took, 1), replica_problems=len(problems),
                   fsck_clean=fsck["clean"])
    assert sorted(seen) == list(range(SAMPLES))           # none lost, none repeated
    assert max(gaps) < 2.0
    assert rebuild["files_done"] > 0 and rebuild["unrecoverable_count"] == 0
    assert problems == [], problems[:5]
    assert fsck["clean"], fsck
