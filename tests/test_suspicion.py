"""Suspicion that fits the facts (issue 27, stager/meta/suspicion.py).

* a suspicion belongs to one incarnation of a data server: a restart (a new boot
  id) is up at once, and so is a target that left;
* a writer's report reroutes its upload; the target turns suspect for everyone
  only when the metadata server's own probe of it fails (one probe in flight per
  target); a report with no upload marks nothing;
* a suspect target is avoided, never excluded where fewer than ``replicas`` nodes
  would be left;
* the same on every metadata server of a PostgreSQL store.

The service runs over a real SQLite store with a clock the test moves; a target's
health is answered by a real HTTP server on 127.0.0.1 (:class:`Health`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web
from reliability_util import Clock, clocked_service, wait_for

from stager import AsyncClient
from stager.config import Config, load_config
from stager.errors import NoTargets
from stager.layout import choose_layout
from stager.meta.http.app import SERVICE
from stager.meta.service import MetaService
from stager.meta.shared import sync
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.protocol import messages as m
from stager.protocol.batch import CreateItem, one
from stager.protocol.models import LayoutSpec, TargetInfo
from stager.testing.cluster import ThreadCluster, wait_for_targets


def dead(i: int) -> str:
    """A URL nothing listens on: a probe there is refused."""
    return f"http://127.0.0.1:{i + 1}"
R2 = LayoutSpec(chunk_size=4096, replicas=2)


class Health:
    """Answers ``GET /v1/health`` as target ``answer_as``, after ``delay`` seconds;
    counts the probes."""

    def __init__(self, answer_as: str, delay: float = 0.0) -> None:
        self.answer_as = answer_as
        self.delay = delay
        self.probes = 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def health(self, request: web.Request) -> web.Response:
        self.probes += 1
        await asyncio.sleep(self.delay)
        return web.json_response({"role": "data", "version": "0", "id": self.answer_as})

    async def __aenter__(self) -> Health:
        app = web.Application()
        app.router.add_get("/v1/health", self.health)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[tuple[MetaService, Clock]]:
    """Four targets on four nodes, none of which answers a probe until a test says."""
    async with clocked_service(tmp_path, 4, dead, boot=True) as got:
        yield got


def states(svc: MetaService) -> dict[str, str]:
    return {t.id: t.state for t in svc.list_targets()}


async def report(svc: MetaService, target: str, file_id: str) -> m.RerouteItem:
    [got] = await svc.reroute(m.RerouteRequest(target, "target_unavailable", "test",
                                               (m.RerouteItem(file_id, 1),)))
    assert not isinstance(got, Exception), got
    upload, _ = got
    assert target not in upload.layout.targets       # the writer's upload avoids it at once
    return upload


async def move(svc: MetaService, target: str, url: str) -> None:
    """Point ``target`` at ``url`` (same incarnation)."""
    svc.targets[target] = replace(svc.targets[target], url=url)


# -- a suspicion belongs to one incarnation -----------------------------------------------
async def test_a_restarted_server_with_a_new_boot_id_is_up_at_once(
        service: tuple[MetaService, Clock]) -> None:
    svc, clock = service
    svc.suspect("t1", "test")
    clock.now += 1
    again = TargetInfo("t1", "node1", dead(1), capacity=1 << 30, boot="boot1")
    assert (await svc.register_target(again)).state == "suspect"    # the same process
    restarted = replace(again, boot="boot1-restarted")
    assert (await svc.register_target(restarted)).state == "up"     # a new one: at once
    assert "t1" in [t.id for t in svc.healthy_targets()] and svc.suspects == {}
    # A data server that sends no boot id: each registration is a new incarnation.
    svc.suspect("t1", "test")
    assert (await svc.register_target(replace(again, boot=""))).state == "up"


async def test_a_target_that_left_is_up_when_its_next_incarnation_registers(
        service: tuple[MetaService, Clock]) -> None:
    svc, clock = service
    svc.suspect("t2", "writers could not reach it while it stopped")
    assert (await svc.leave("t2")).state == "down"
    clock.now += 0.5
    back = await svc.register_target(TargetInfo("t2", "node2", dead(2), boot="boot2-next"))
    assert back.state == "up" and states(svc)["t2"] == "up"


# -- a report is checked ------------------------------------------------------------------
async def test_a_reported_target_that_answers_its_probe_is_not_suspect_for_others(
        service: tuple[MetaService, Clock]) -> None:
    svc, _ = service
    async with Health("t0") as health:
        await move(svc, "t0", health.url)
        upload, _ = one(await svc.create([CreateItem("/f", R2)]))
        assert "t0" in upload.layout.targets
        await report(svc, "t0", upload.file_id)
        assert health.probes == 1
        assert states(svc)["t0"] == "up"
        fresh, _ = one(await svc.create([CreateItem("/g", R2)]))   # striped over all four again
        assert "t0" in fresh.layout.targets


async def test_a_reported_target_that_fails_its_probe_is_suspect_for_everyone(
        service: tuple[MetaService, Clock]) -> None:
    svc, _ = service
    async with Health("someone-else") as impostor:      # answers, but not as t1
        await move(svc, "t1", impostor.url)
        upload, _ = one(await svc.create([CreateItem("/f", R2)]))
        await report(svc, "t1", upload.file_id)
        assert states(svc)["t1"] == "suspect"
    upload, _ = one(await svc.create([CreateItem("/g", R2)]))
    await report(svc, "t2", upload.file_id)             # refused
    assert states(svc)["t2"] == "suspect"
    fresh, _ = one(await svc.create([CreateItem("/h", R2)]))
    assert set(fresh.layout.targets) == {"t0", "t3"}


async def test_reroutes_with_no_items_mark_nothing(service: tuple[MetaService, Clock]) -> None:
    svc, _ = service
    async with Health("t0") as health:
        await move(svc, "t0", health.url)
        for target in ("t0", "t1", "t2", "t3"):
            assert await svc.reroute(m.RerouteRequest(target, "target_unavailable",
                                                      "no", ())) == []
        assert health.probes == 0
    assert set(states(svc).values()) == {"up"}


async def test_one_probe_at_a_time_per_target_however_many_writers_report_it(
        service: tuple[MetaService, Clock]) -> None:
    svc, _ = service
    async with Health("t0", delay=0.3) as health:
        await move(svc, "t0", health.url)
        uploads = [one(await svc.create([CreateItem(f"/f{i}", R2)]))[0] for i in range(10)]
        await asyncio.gather(*(report(svc, "t0", u.file_id) for u in uploads))
        assert health.probes == 1
        assert states(svc)["t0"] == "up"


async def test_a_probe_that_fails_across_a_restart_does_not_suspect_the_new_process(
        service: tuple[MetaService, Clock]) -> None:
    svc, _ = service
    async with Health("t0", delay=2.0) as hung:         # past the probe's 1 s
        await move(svc, "t0", hung.url)
        upload, _ = one(await svc.create([CreateItem("/f", R2)]))
        reported = asyncio.ensure_future(report(svc, "t0", upload.file_id))
        await asyncio.sleep(0.2)
        await svc.register_target(TargetInfo("t0", "node0", hung.url, boot="boot0-next"))
        await reported
        assert states(svc)["t0"] == "up"


# -- suspect is avoided, never excluded -----------------------------------------------------
def targets_in(*states_: str) -> list[TargetInfo]:
    return [TargetInfo(f"t{i}", f"n{i}", dead(i), capacity=1 << 30, state=s)
            for i, s in enumerate(states_)]


def test_a_layout_takes_up_targets_first_then_as_few_suspects_as_it_needs() -> None:
    ts = targets_in("up", "suspect", "suspect", "suspect", "down")
    for start in range(8):
        for replicas in (1, 2, 3, 4):
            layout = choose_layout(ts, chunk_size=4096, stripe_count=0, replicas=replicas,
                                   max_stripe_count=8, start=start)
            assert "t0" in layout.targets and "t4" not in layout.targets
            assert len(layout.targets) == max(replicas, 1)      # the up one + just enough
    with pytest.raises(NoTargets, match="5 replicas need 5 distinct nodes"):
        choose_layout(ts, chunk_size=4096, stripe_count=0, replicas=5, max_stripe_count=8,
                      start=0)
    ups = targets_in("up", "up", "up", "suspect")
    layout = choose_layout(ups, chunk_size=4096, stripe_count=0, replicas=2,
                           max_stripe_count=8, start=0)
    assert set(layout.targets) == {"t0", "t1", "t2"}              # enough up: avoided


async def test_with_two_of_three_nodes_suspect_a_write_is_placed_and_rerouted(
        service: tuple[MetaService, Clock]) -> None:
    svc, clock = service
    clock.now += 11                     # t3 is silent: down; t0..t2 heartbeat
    for t in ("t0", "t1", "t2"):
        await svc.heartbeat(t, capacity=1 << 30, used=0, chunks=0)
    svc.suspect("t1", "test")
    svc.suspect("t2", "test")
    with pytest.raises(NoTargets):      # not heard of since: most likely dead
        one(await svc.create([CreateItem("/f", R2)]))
    clock.now += 0.5
    for t in ("t0", "t1", "t2"):
        await svc.heartbeat(t, capacity=1 << 30, used=0, chunks=0)
    upload, _ = one(await svc.create([CreateItem("/f", R2)]))
    assert "t0" in upload.layout.targets and "t3" not in upload.layout.targets
    assert len(upload.layout.targets) == 2                      # one suspect, not both
    moved = await report(svc, "t0", upload.file_id)             # t0 refuses: suspect too
    assert set(moved.layout.targets) == {"t1", "t2"}
    assert states(svc) == {"t0": "suspect", "t1": "suspect", "t2": "suspect", "t3": "down"}
    assert "t0" not in [t.id for t in svc.placeable_targets()]  # until it heartbeats


async def test_a_write_fails_only_when_fewer_than_replicas_nodes_answer(
        service: tuple[MetaService, Clock]) -> None:
    svc, clock = service
    upload, _ = one(await svc.create([CreateItem("/f", R2)]))
    assert len(upload.layout.targets) == 4
    clock.now += 11                     # t0 and t1 are silent: down
    for t in ("t2", "t3"):
        await svc.heartbeat(t, capacity=1 << 30, used=0, chunks=0)
    [got] = await svc.reroute(m.RerouteRequest("t2", "target_unavailable", "gone",
                                               (m.RerouteItem(upload.file_id, 1),)))
    assert isinstance(got, NoTargets) and "need 2 nodes, 1 up" in str(got)


# -- the same rule on every metadata server of a PostgreSQL store -------------------------
async def test_every_metadata_server_drops_a_suspicion_when_a_new_process_registers(
        pg_url: str) -> None:
    config = Config(target_timeout=30.0)
    a = MetaService(PostgreSQLStore(pg_url), config)
    b = MetaService(PostgreSQLStore(pg_url), config)
    try:
        for svc in (a, b):
            await svc.start()
        for i in range(3):
            await a.register_target(TargetInfo(f"t{i}", f"n{i}", dead(i), boot=f"b{i}"))
        await sync(b)
        a.suspect("t1", "its probe failed")
        await a.share_suspect("t1")
        b.suspect("t2", "its probe failed")
        await b.share_suspect("t2")
        await sync(a)
        await sync(b)
        assert states(a) == states(b) == {"t0": "up", "t1": "suspect", "t2": "suspect"}
        # Both restart; each registers with the server that did not suspect it.
        await b.register_target(TargetInfo("t1", "n1", dead(1), boot="b1-next"))
        await a.register_target(TargetInfo("t2", "n2", dead(2), boot="b2-next"))
        await sync(a)
        await sync(b)
        assert states(a) == states(b) == {"t0": "up", "t1": "up", "t2": "up"}
        # A leave told one server is undone, on every server, by the next process.
        await a.leave("t0")
        await sync(b)
        assert states(b)["t0"] == "down"
        await b.register_target(TargetInfo("t0", "n0", dead(0), boot="b0-next"))
        await sync(a)
        assert states(a) == states(b) == {"t0": "up", "t1": "up", "t2": "up"}
        # A suspicion of the same process still holds everywhere.
        a.suspect("t0", "its probe failed")
        await a.share_suspect("t0")
        await b.register_target(TargetInfo("t0", "n0", dead(0), boot="b0-next"))
        await sync(b)
        assert states(b)["t0"] == "suspect"
    finally:
        a.close()
        b.close()


# -- through real servers -------------------------------------------------------------------
def test_a_restarted_data_server_is_up_at_once_and_a_healthy_report_marks_nothing(
        tmp_path: Path) -> None:
    with ThreadCluster(tmp_path, 3, target_timeout=30.0) as cluster:
        svc: MetaService = cluster.meta.app[SERVICE]  # type: ignore[union-attr]
        victim = cluster.target_id(1)
        cluster.loop.call_soon_threadsafe(svc.suspect, victim, "test")
        wait_for_targets(cluster.meta_url, 2, exact=True)
        cluster.stop_data(1)
        start = time.monotonic()
        cluster.start_data(1)           # a new process: registers with a new boot id
        cluster.wait_targets(3, timeout=10)
        assert time.monotonic() - start < 10           # not target_timeout (30 s) later

        async def writes() -> None:
            async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
                file_id, writer = await c.create("/r.bin", layout=R2)
                alive = writer.layout.targets[0]
                for _ in range(4):                      # empty reports: nothing
                    assert await c.reroute(alive, NoTargets("x"), []) == []
                [moved] = await c.reroute(alive, NoTargets("x"), [m.RerouteItem(file_id, 0)])
                assert isinstance(moved, m.Upload) and alive not in moved.layout.targets
                assert {t.state for t in await c.targets()} == {"up"}
                await c.abort(file_id, writer)

        asyncio.run(writes())


def test_with_two_of_three_nodes_suspect_a_write_succeeds(tmp_path: Path) -> None:
    with ThreadCluster(tmp_path, 3, target_timeout=30.0) as cluster:
        svc: MetaService = cluster.meta.app[SERVICE]  # type: ignore[union-attr]
        suspects = {cluster.target_id(1), cluster.target_id(2)}
        for t in suspects:
            cluster.loop.call_soon_threadsafe(svc.suspect, t, "test")
        wait_for_targets(cluster.meta_url, 1, exact=True)
        wait_for(lambda: len(svc.placeable_targets()) == 3, 5, "heartbeats since")

        async def writes() -> None:
            async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
                body = bytes(range(256)) * 1000
                info = await c.pipe("/two-suspect.bin", body, layout=R2)
                assert info.layout is not None and len(set(info.layout.nodes)) == 2
                assert cluster.target_id(0) in info.layout.targets
                assert await c.cat("/two-suspect.bin") == body
                assert {t.id for t in await c.targets() if t.state == "suspect"} == suspects

        asyncio.run(writes())
