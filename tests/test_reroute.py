"""The metadata side of writes that route around a failed target (stager/meta/reroute.py).

The service runs over a real SQLite store with a clock the test moves: a
reported target that does not answer the metadata server's probe (nothing
listens at these URLs) turns suspect at once, leaves new layouts, and is up
again after ``target_timeout`` if it kept heartbeating (down if it did not).
tests/test_suspicion.py has the rest of the rules.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from reliability_util import Clock, clocked_service

from stager.errors import NoTargets, UploadNotFound
from stager.layout import choose_layout, chunk_targets
from stager.meta.reroute import replacement
from stager.meta.service import MetaService
from stager.meta.store.base import Upload
from stager.protocol.batch import CommitItem, CreateItem, one
from stager.protocol.messages import RerouteItem, RerouteRequest
from stager.protocol.models import FileInfo, LayoutSpec, TargetInfo

SMALL_R2 = LayoutSpec(chunk_size=4096, replicas=2)


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[tuple[MetaService, Clock]]:
    async with clocked_service(tmp_path, 4, lambda i: f"http://127.0.0.1:{i + 1}") as got:
        yield got


async def report(svc: MetaService, target: str, code: str, file_id: str, chunks: int
                 ) -> tuple[Upload, FileInfo]:
    """One writer's reroute report for one upload: the upload as placed anew."""
    [got] = await svc.reroute(RerouteRequest(target, code, "test",
                                             (RerouteItem(file_id, chunks),)))
    assert not isinstance(got, Exception), got
    return got


async def heartbeat_all(svc: MetaService, but: str = "") -> None:
    for t in list(svc.targets):
        if t != but:
            await svc.heartbeat(t, capacity=1 << 30, used=0, chunks=0)


async def test_a_reported_target_is_replaced_in_the_upload_and_suspect_at_once(
        service: tuple[MetaService, Clock]) -> None:
    svc, clock = service
    upload, _ = one(await svc.create([CreateItem("/f", SMALL_R2)]))
    victim = upload.layout.targets[0]
    placed, info = await report(svc, victim, "target_unavailable", upload.file_id, 3)
    assert victim not in placed.layout.targets
    assert info.layout == placed.layout and set(info.locations) == set(placed.layout.targets)
    assert one(await svc.store.get_uploads([upload.file_id])).layout == placed.layout
    for index in range(2 * placed.layout.stripe_count):        # every chunk keeps 2 nodes
        holders = chunk_targets(placed.layout, index)
        assert len({placed.layout.nodes[placed.layout.targets.index(t)] for t in holders}) == 2
    assert svc.targets[victim].state == "suspect"
    for _ in range(5):                                         # no new layout names it
        fresh, _ = one(await svc.create([CreateItem("/g", LayoutSpec(replicas=2))]))
        assert victim not in fresh.layout.targets
    entry = one(await svc.commit([CommitItem(upload.file_id, 0, ())]))
    assert entry.layout == placed.layout                       # committed as written


async def test_a_suspect_that_keeps_heartbeating_is_up_again_after_target_timeout(
        service: tuple[MetaService, Clock]) -> None:
    svc, clock = service
    svc.suspect("t1", "timed out")
    clock.now += 5
    await heartbeat_all(svc)
    assert svc.targets["t1"].state == "suspect"               # a heartbeat does not clear it
    clock.now += 6
    await heartbeat_all(svc)
    assert [t.id for t in svc.healthy_targets()] == ["t0", "t1", "t2", "t3"]
    svc.suspect("t2", "refused")
    clock.now += 11
    await heartbeat_all(svc, but="t2")                         # really dead: no heartbeats
    assert {t.id: t.state for t in svc.list_targets()}["t2"] == "down"


async def test_a_second_report_for_the_same_upload_changes_nothing_more(
        service: tuple[MetaService, Clock]) -> None:
    svc, _ = service
    upload, _ = one(await svc.create([CreateItem("/f", SMALL_R2)]))
    victim = upload.layout.targets[1]
    first, _ = await report(svc, victim, "target_unavailable", upload.file_id, 1)
    second, _ = await report(svc, victim, "target_unavailable", upload.file_id, 1)
    assert first.layout == second.layout


async def test_a_full_target_is_replaced_in_the_upload_but_not_suspect(
        service: tuple[MetaService, Clock]) -> None:
    svc, _ = service
    upload, _ = one(await svc.create([CreateItem("/f", SMALL_R2)]))
    full = upload.layout.targets[2]
    placed, _ = await report(svc, full, "no_space", upload.file_id, 2)
    assert full not in placed.layout.targets
    assert svc.targets[full].state == "up"                  # space frees up: still placed


async def test_reroute_fails_per_item_with_a_clear_reason(
        service: tuple[MetaService, Clock]) -> None:
    svc, clock = service
    upload, _ = one(await svc.create([CreateItem("/f", SMALL_R2)]))
    clock.now += 11                 # t0 and t1 silent: down (a suspect one would still do)
    for t in ("t2", "t3"):
        await svc.heartbeat(t, capacity=1 << 30, used=0, chunks=0)
    results = await svc.reroute(RerouteRequest("t2", "target_unavailable", "gone", (
        RerouteItem(upload.file_id, 1), RerouteItem("f" * 32, 1))))
    assert len(upload.layout.targets) == 4                     # striped over all four
    assert isinstance(results[0], NoTargets) and "need 2 nodes, 1 up" in str(results[0])
    assert isinstance(results[1], UploadNotFound)


def test_replacement_keeps_a_healthy_layout_and_names_what_is_missing() -> None:
    targets = [TargetInfo(f"t{i}", f"n{i}", "http://h:1", capacity=1 << 30) for i in range(3)]
    layout = choose_layout(targets, chunk_size=4096, stripe_count=3, replicas=3,
                           max_stripe_count=8, start=0)
    assert replacement(layout, 5, targets) == layout
    with pytest.raises(NoTargets, match="need 3 nodes, 2 up"):
        replacement(layout, 5, targets[:2])
