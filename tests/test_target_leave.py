"""A data server that is stopping says so: its target is down at once (deploy/k8s: a
pod's SIGTERM), not ``target_timeout`` later; a heartbeat brings it up again."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request

from stager.config import Config
from stager.meta.service import MetaService
from stager.meta.shared import sync
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.protocol.models import TargetInfo
from stager.protocol.routes import route
from stager.testing.cluster import ProcessCluster, ThreadCluster, wait_for_targets


def _states(meta_url: str) -> dict[str, str]:
    with urllib.request.urlopen(route("list_targets").url(meta_url), timeout=5) as resp:
        return {t["id"]: t["state"] for t in json.load(resp)["targets"]}


def _leave(meta_url: str, target_id: str) -> dict[str, object]:
    req = urllib.request.Request(route("leave_target").url(meta_url, target_id=target_id),
                                 data=b"{}", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return dict(json.load(resp))


def test_leave_marks_down_until_the_next_heartbeat(tmp_path):
    with ThreadCluster(tmp_path, data_servers=1) as cluster:
        cluster.wait_targets(1)
        target = cluster.target_id(0)
        assert _leave(cluster.meta_url, target)["state"] == "down"
        assert _states(cluster.meta_url)[target] == "down"
        cluster.wait_targets(1, timeout=5)      # still running: its heartbeat counts
        try:
            _leave(cluster.meta_url, "no-such-target")
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
        else:
            raise AssertionError("leave of an unknown target did not fail")


def test_sigterm_marks_the_target_down_at_once(tmp_path):
    # Missed heartbeats would take 30 s to show: only the leave can explain a prompt down.
    with ProcessCluster(tmp_path, data_servers=2,
                        env={"STAGER_TARGET_TIMEOUT": "30"}) as cluster:
        wait_for_targets(cluster.meta_url, 2)
        leaving, staying = cluster.target_id(0), cluster.target_id(1)
        os.kill(cluster.data_pid(0), signal.SIGTERM)
        start = time.monotonic()
        while _states(cluster.meta_url)[leaving] != "down":
            assert time.monotonic() - start < 5, "the target was not marked down"
            time.sleep(0.05)
        assert _states(cluster.meta_url)[staying] == "up"


async def test_the_other_metadata_servers_read_the_leave_back(pg_url: str) -> None:
    """On a shared store, a target that left is down on every server, not only on the
    one it told, until it heartbeats again (wherever that heartbeat lands)."""
    config = Config(target_timeout=30.0)
    a = MetaService(PostgreSQLStore(pg_url), config)
    b = MetaService(PostgreSQLStore(pg_url), config)
    try:
        for svc in (a, b):
            await svc.start()
        await a.register_target(TargetInfo("t0", "n0", "http://127.0.0.1:1"))
        await a.register_target(TargetInfo("t1", "n1", "http://127.0.0.1:2"))
        await sync(b)
        assert (await a.leave("t0")).state == "down"
        await sync(b)
        assert [(t.id, t.state) for t in b.list_targets()] == [("t0", "down"), ("t1", "up")]
        await b.heartbeat("t0", capacity=100, used=0, chunks=0)
        await sync(a)
        assert [t.state for t in a.list_targets()] == ["up", "up"]
    finally:
        a.close()
        b.close()
