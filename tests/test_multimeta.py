"""Several metadata servers on one PostgreSQL store (issue 19, part 2): one
namespace, the same targets, one holder of the background duties, revocations
seen by all."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import raw_http

from stager import Client
from stager.config import Config
from stager.errors import Unauthenticated
from stager.meta.jobtable import JobTable
from stager.meta.service import MetaService
from stager.meta.shared import sync
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.protocol.models import TargetInfo
from stager.testing import ProcessCluster
from stager.testing.postgres import PostgresServer

pytestmark = pytest.mark.slow      # stager processes on PostgreSQL: not in make check


async def test_one_store_of_several_holds_the_duties_until_it_goes(pg_url: str) -> None:
    first, second = PostgreSQLStore(pg_url), PostgreSQLStore(pg_url)
    try:
        assert await first.hold_duties()
        assert not await second.hold_duties()
        assert await first.hold_duties()             # held, not taken again
        first.close()                                 # its lock connection drops
        # PostgreSQL frees the lock once its backend sees the connection gone: the
        # other takes it at one of its next rounds (a server asks every interval)
        for _ in range(100):
            if await second.hold_duties():
                break
            await asyncio.sleep(0.05)
        assert await second.hold_duties()
        third = PostgreSQLStore(pg_url)
        try:
            assert not await third.hold_duties()
        finally:
            third.close()
    finally:
        first.close()
        second.close()


async def test_what_one_server_hears_the_other_reads_back(pg_url: str) -> None:
    """Heartbeats, suspects, retiring targets, status sections and loader reports
    written through one service are what another on the same database sees."""
    config = Config(target_timeout=3.0)
    a = MetaService(PostgreSQLStore(pg_url), config)
    b = MetaService(PostgreSQLStore(pg_url), config)
    try:
        for svc in (a, b):
            await svc.start()
        for i in range(3):
            await a.register_target(TargetInfo(f"t{i}", f"n{i}", f"http://127.0.0.1:{i + 1}"))
        await sync(b)
        assert [(t.id, t.state) for t in b.list_targets()] == [
            ("t0", "up"), ("t1", "up"), ("t2", "up")]
        # Only a's heartbeats arrive; b judges liveness from what a stored.
        a.clock = b.clock = lambda: time.time() + 5.0
        await a.heartbeat("t0", capacity=100, used=7, chunks=1)
        await a.heartbeat("t1", capacity=100, used=0, chunks=0)
        a.suspect("t1", "a writer could not reach it")
        await a.share_suspect("t1")
        await a.retire("t2")
        await a.share_status("fsck", {"clean": True})
        await sync(b)
        assert [(t.id, t.state) for t in b.list_targets()] == [
            (t.id, t.state) for t in a.list_targets()] == [
            ("t0", "up"), ("t1", "suspect"), ("t2", "down")]
        assert b.targets["t0"].used == 7 and b.retiring == {"t2"}
        assert b.shared_status == {"fsck": {"clean": True}}
        assert sum([a.duties_held, b.duties_held]) <= 1
        await a.retired({"t2"})
        await sync(b)
        assert b.retiring == set()
        # Loader telemetry reported to one is listed by the other.
        jobs_a, jobs_b = JobTable(store=a.store), JobTable(store=b.store)
        entry = jobs_a.report("job1", 0, None, {"interval": 1.0, "world_size": 1,
                                               "samples": 5})
        await jobs_a.share(entry)
        await jobs_b.load()
        [job] = jobs_b.jobs().jobs
        assert job.job == "job1" and job.summary["samples"] == 5
    finally:
        a.close()
        b.close()


async def test_duties_are_given_up_while_the_database_is_down(
        postgres: PostgresServer, pg_url: str) -> None:
    """No holder believes it still holds them after its lock connection dropped: the
    first to ask once the database is back takes them, and only it."""
    a, b = PostgreSQLStore(pg_url, connect_timeout=1.0), PostgreSQLStore(pg_url,
                                                                         connect_timeout=1.0)
    try:
        assert await a.hold_duties() and not await b.hold_duties()
        postgres.stop("immediate")
        try:
            assert not await a.hold_duties() and not await b.hold_duties()
        finally:
            postgres.start()
        assert await b.hold_duties()
        assert not await a.hold_duties()
    finally:
        a.close()
        b.close()


def wait_for(what: Callable[[], Any], timeout: float, step: float = 0.05) -> float:
    """Seconds until ``what()`` is true; fails after ``timeout``."""
    start = time.monotonic()
    while not what():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not true within {timeout}s: {what}")
        time.sleep(step)
    return time.monotonic() - start


@pytest.fixture
def two_metas(tmp_path: Path, pg_url: str) -> Iterator[ProcessCluster]:
    with ProcessCluster(tmp_path / "c", data_servers=2, auth=True, meta_store=pg_url,
                        meta_servers=2) as cluster:
        yield cluster


def test_two_metadata_servers_share_namespace_targets_revocations_and_duties(
        two_metas: ProcessCluster) -> None:
    cluster = two_metas
    assert len(cluster.meta_urls) == 2 and cluster.info["meta"] == cluster.info["metas"][0]
    admin = cluster.admin_token
    a, b = (Client(url, token=admin) for url in cluster.meta_urls)
    try:
        # A file created through one is read through the other.
        a.pipe("/shared/kept", b"kept")
        a.pipe("/shared/f", b"through a" * 1000)
        assert b.cat("/shared/f") == b"through a" * 1000
        b.rm("/shared/f")
        assert not a.exists("/shared/f")

        # The same targets, in the same states (heartbeats reach only the first).
        def states(c: Client) -> list[tuple[str, str]]:
            return [(t.id, t.state) for t in c.targets()]
        wait_for(lambda: states(a) == states(b) and len(states(a)) == 2, 5)
        assert {s for _, s in states(b)} == {"up"}

        # A token revoked through one is refused by the other within about a second.
        made = a.create_token(["read"], ["/"], 600, "revoked soon")
        reader = Client(cluster.meta_urls[1], token=made.token)
        try:
            assert reader.ls("/") is not None
            a.revoke_token(made.info.id)

            def refused() -> bool:
                try:
                    reader.ls("/")
                except Unauthenticated:
                    return True
                return False
            assert wait_for(refused, 2.0) < 2.0
        finally:
            reader.close()

        # Loader telemetry sent to one is listed by the other.
        auth = {"Authorization": f"Bearer {admin}", "Content-Type": "application/json"}
        sent = raw_http(cluster.meta_urls[0], "PUT", "/v1/jobs/multi/ranks/1", headers=auth,
                        body=json.dumps({"interval": 1.0, "world_size": 2,
                                         "samples": 3}).encode())
        assert sent.status == 200
        listed = raw_http(cluster.meta_urls[1], "GET", "/v1/jobs", headers=auth).json()
        assert [j["job"] for j in listed["jobs"]] == ["multi"]

        # The background duties run on exactly one of them...
        def holders() -> list[bool]:
            return [c.status()["duties"]["held"] for c in (a, b)]
        wait_for(lambda: sum(holders()) == 1, 5)
        holder = holders().index(True)
        other = (a, b)[1 - holder]
        # ... and move to the other within seconds when the holder is killed.
        cluster.kill_meta(holder)
        moved = wait_for(lambda: other.status()["duties"]["held"], 10)
        print(f"duties moved in {moved:.2f}s")
        assert other.cat("/shared/kept") == b"kept"
    finally:
        a.close()
        b.close()


def test_a_file_on_a_target_another_server_heard_first_reads_through_this_one(
        tmp_path: Path, pg_url: str) -> None:
    """A data server that registers with the first metadata server after the second
    started: the second reads it back only every ``heartbeat_interval / 2`` (here
    30 s).  A file written through the first at once, on that target, reads through
    the second: its stat reads the shared state back before answering (CI saw
    ``target … is unknown`` from the second once clusters started in under a second)."""
    slow = {"STAGER_HEARTBEAT_INTERVAL": "60", "STAGER_TARGET_TIMEOUT": "600"}
    with ProcessCluster(tmp_path / "c", data_servers=0, meta_store=pg_url, meta_servers=2,
                        fast=False, env=slow) as cluster:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
        data = subprocess.Popen(
            [sys.executable, "-m", "stager", "--meta", cluster.meta_url, "data", "--root",
             str(tmp_path / "late"), "--port", "0", "--node", "late"],
            env={**env, **slow}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        a, b = (Client(url) for url in cluster.meta_urls)
        try:
            wait_for(lambda: len(a.targets()) == 1, 30)
            a.pipe("/fresh/f", b"through a" * 1000)
            assert b.cat("/fresh/f") == b"through a" * 1000
            assert b.stat("/fresh/f").locations == a.stat("/fresh/f").locations
        finally:
            a.close()
            b.close()
            data.terminate()
            data.wait(20)


def test_restart_brings_back_each_metadata_server(tmp_path: Path, pg_url: str) -> None:
    with ProcessCluster(tmp_path / "c", data_servers=1, restart=True, meta_store=pg_url,
                        meta_servers=2) as cluster:
        first, second = cluster.meta_urls
        with Client(first) as a:
            a.pipe("/r/f", b"before")
        old = cluster.meta_pid(1)
        cluster.kill_meta(1)
        cluster.wait_restarted("meta", 1, old)
        assert cluster.meta_urls == [first, second]          # same ports
        assert cluster.info["meta"] == cluster.info["metas"][0]
        with Client(second) as b:
            assert b.cat("/r/f") == b"before"


def test_status_lists_the_metadata_servers_and_a_killed_one_down(
        two_metas: ProcessCluster) -> None:
    """Issue 26: with one of two metadata servers dead, everything looked healthy.
    ``status`` (and ``stager status``) lists both, which holds the duties; after a
    kill -9 of the holder the other shows it down and holds the duties itself.  And
    ``stager up`` prints the ``--meta A,B`` list a client needs."""
    cluster = two_metas
    urls = cluster.meta_urls
    admin = cluster.admin_token
    clients = [Client(url, token=admin) for url in urls]
    try:
        def metas(i: int) -> dict[str, dict[str, Any]]:
            return {m["url"]: m for m in clients[i].status()["metas"]}

        def settled(i: int) -> bool:
            seen = metas(i)
            return set(seen) == set(urls) and {m["state"] for m in seen.values()} == {"up"} \
                and sum(m["duties"] for m in seen.values()) == 1
        wait_for(lambda: settled(0) and settled(1), 10)
        seen = metas(1)
        assert all(m["store"].startswith("postgresql://") and "@127.0.0.1:" in m["store"]
                   for m in seen.values())
        holder = next(i for i, url in enumerate(urls) if seen[url]["duties"])
        other = 1 - holder
        cluster.kill_meta(holder)
        killed = time.monotonic()

        def moved() -> bool:
            seen = metas(other)
            return seen[urls[holder]]["state"] == "down" and not seen[urls[holder]]["duties"] \
                and seen[urls[other]]["state"] == "up" and seen[urls[other]]["duties"]
        wait_for(moved, 15)
        print(f"the killed metadata server shown down {time.monotonic() - killed:.1f}s later")
        # `stager up` printed the list a client needs; with it, the client fails over
        printed = [ln.split("--meta ", 1)[1].split()[0]
                   for ln in (cluster.root / "up.log").read_text().splitlines()
                   if ln.strip().startswith("clients: --meta ")]
        assert printed == [",".join(urls)], printed
        env = {**os.environ, "STAGER_TOKEN": admin}
        out = subprocess.run([sys.executable, "-m", "stager", "--meta", printed[0], "status"],
                             capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        assert f"1/2 metadata servers up; DOWN: {urls[holder]}" in out.stdout, out.stdout
        line = next(ln for ln in out.stdout.splitlines() if urls[other] in ln)
        assert " up " in line and "duties" in line, out.stdout
    finally:
        for c in clients:
            c.close()
