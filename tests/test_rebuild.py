"""Rebuild: a lost or removed target's chunks are copied back to R from surviving replicas."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import start_cluster
from reliability_util import aeventually, replicas_on_disk, target_roots

from stager import AsyncClient
from stager.config import load_config
from stager.meta.service import MetaService
from stager.meta.store.sqlite.store import SQLiteStore
from stager.meta.upkeep.copier import ChunkCopier
from stager.meta.upkeep.rebuild import Rebuilder
from stager.protocol.models import FileInfo, LayoutSpec, TargetInfo
from stager.testing import ThreadCluster

pytestmark = pytest.mark.slow      # processes: not in make check

SMALL = 64 * 1024
SIZES = [0, 1, SMALL, SMALL * 5 + 3, SMALL * 9]


async def write_set(c: AsyncClient, prefix: str, replicas: int = 2,
                    stripe: int = 0) -> dict[str, bytes]:
    data = {}
    for i, size in enumerate(SIZES * 2):
        body = os.urandom(size)
        await c.pipe(f"{prefix}/f{i}.bin", body,
                     layout=LayoutSpec(chunk_size=SMALL, replicas=replicas,
                                       stripe_count=stripe))
        data[f"{prefix}/f{i}.bin"] = body
    return data


async def rebuilt(c: AsyncClient, passes: int = 1) -> dict:
    status = await c.status()
    rb = status["rebuild"]
    return status if rb["passes"] >= passes and rb["state"] == "idle" else {}


async def wait_rebuilt(c: AsyncClient, timeout: float = 30) -> dict:
    got: dict = {}

    async def done() -> bool:
        nonlocal got
        got = await rebuilt(c)
        return bool(got)

    await aeventually(done, timeout, "the rebuild to finish")
    return got


async def infos(c: AsyncClient, paths: list[str]) -> list[FileInfo]:
    return [await c.stat(p, cached=False) for p in paths]


def stager(meta: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
    return subprocess.run([sys.executable, "-m", "stager", "--meta", meta, *args],
                          capture_output=True, text=True, env=env, timeout=60)


async def test_target_remove_rebuilds_every_file_back_to_r(tmp_path: Path,
                                                           slow_callbacks) -> None:
    cluster = start_cluster(tmp_path, 4, replicas=2, fsck_interval=0)
    try:
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            data = await write_set(c, "/rb")
            victim = cluster.target_id(2)
            on_victim = [i.path for i in await infos(c, list(data))
                         if i.layout is not None and victim in i.layout.targets]
            assert on_victim
            out = await asyncio.to_thread(stager, cluster.meta_url, "target", "remove", victim)
            assert out.returncode == 0 and "removed" in out.stdout, out.stderr
            status = await wait_rebuilt(c)
            rb = status["rebuild"]
            print(f"rebuild: {rb['files_done']} files, {rb['chunks_copied']} chunks, "
                  f"{rb['bytes_copied']} bytes at {rb['rate']} B/s")
            assert rb["files_done"] == len(on_victim) and rb["bytes_remaining"] == 0
            assert rb["bytes_copied"] == rb["bytes_total"] > 0
            assert rb["unrecoverable_count"] == 0 and rb["lost"] == [victim]
            roots = target_roots(tmp_path, 4)
            for info in await infos(c, list(data)):
                assert info.layout is not None and victim not in info.layout.targets
                assert replicas_on_disk(roots, info) == [], info.path
            # nothing is read from the removed target any more: stop it, read everything
            await asyncio.to_thread(cluster.stop_data, 2)
            for path, body in data.items():
                assert await c.cat(path) == body
            states = {t.id: t.state for t in await c.targets()}
            assert states[victim] == "removed"
        text = await asyncio.to_thread(stager, cluster.meta_url, "status")
        assert "rebuild: idle" in text.stdout and "1 removed" not in text.stderr
        js = json.loads((await asyncio.to_thread(stager, cluster.meta_url, "status",
                                                 "--json")).stdout)
        assert js["targets_lost"] == 1 and js["rebuild"]["files_done"] == len(on_victim)
    finally:
        cluster.stop()


async def test_a_target_down_too_long_is_lost_rebuilt_and_rejoins_empty(
        tmp_path: Path, slow_callbacks) -> None:
    """Three nodes, one lost: two replicas on the two nodes left (one target takes
    two slots).  When it comes back it rejoins empty; fsck collects its old chunks."""
    cluster = start_cluster(tmp_path, 3, replicas=2, target_lost_after=0.5, fsck_interval=0,
                            orphan_grace=0)
    try:
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            data = await write_set(c, "/lost")
            lost = cluster.target_id(1)
            await asyncio.to_thread(cluster.stop_data, 1)
            started = time.monotonic()
            status = await wait_rebuilt(c)
            print(f"lost after {cluster.config.target_timeout}s down + 0.5s; rebuilt "
                  f"{status['rebuild']['files_done']} files in "
                  f"{time.monotonic() - started:.1f}s")
            assert status["rebuild"]["lost"] == [lost]
            roots = target_roots(tmp_path, 3)
            for info in await infos(c, list(data)):
                assert info.layout is not None and lost not in info.layout.targets
                assert replicas_on_disk(roots, info) == [], info.path
                assert await c.cat(info.path) == data[info.path]
            assert (await c.fsck())["clean"]
            # back: rejoins as an empty target; its stale chunks are orphans
            await asyncio.to_thread(cluster.start_data, 1)

            async def up() -> bool:
                return {t.id: t.state for t in await c.targets()}[lost] == "up"

            await aeventually(up, 10, "the lost target to rejoin")
            first = await c.fsck(repair=True)
            assert first["orphans"] > 0 and first["orphans_deleted"] == first["orphans"]
            assert first["missing"] == 0
            second = await c.fsck()
            assert second["clean"] and second["orphans"] == 0
            for path, body in data.items():
                assert await c.cat(path) == body
            # and new files may land on it again
            await c.pipe("/lost/new.bin", b"n" * SMALL * 3,
                         layout=LayoutSpec(chunk_size=SMALL, stripe_count=3, replicas=2))
            new = await c.stat("/lost/new.bin", cached=False)
            assert new.layout is not None and lost in new.layout.targets
    finally:
        cluster.stop()


async def test_rebuild_is_rate_limited_shows_progress_and_survives_a_meta_restart(
        tmp_path: Path, slow_callbacks) -> None:
    rate = 384 << 10
    cluster = start_cluster(tmp_path, 4, replicas=2, fsck_interval=0, rebuild_rate=rate,
                            rebuild_concurrency=1)
    try:
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            body = os.urandom(SMALL * 48)     # 3 MiB; half its chunks have a copy on any target
            await c.pipe("/slow/big.bin", body,
                         layout=LayoutSpec(chunk_size=SMALL, stripe_count=4, replicas=2))
            victim = cluster.target_id(0)
            start = time.monotonic()
            await c.remove_target(victim)
            seen: list[dict] = []

            async def midway() -> bool:
                rb = (await c.status())["rebuild"]
                seen.append(rb)
                return rb["state"] == "running" and 0 < rb["bytes_copied"] \
                    and rb["bytes_remaining"] > 0
            await aeventually(midway, 10, "a rebuild in progress")
            rb = seen[-1]
            assert rb["bytes_copied"] + rb["bytes_remaining"] == rb["bytes_total"]
            # the metadata server dies mid-rebuild; the new one carries on
            port = urlsplit(cluster.meta_url).port
            await asyncio.to_thread(cluster.stop_meta)
            await asyncio.to_thread(cluster.start_meta, port)
            status = await wait_rebuilt(c, 30)
            took = time.monotonic() - start
            info = await c.stat("/slow/big.bin", cached=False)
            assert info.layout is not None and victim not in info.layout.targets
            assert replicas_on_disk(target_roots(tmp_path, 4), info) == []
            assert await c.cat("/slow/big.bin") == body
            total = seen[-1]["bytes_total"]
            print(f"rebuild of {total} bytes at {rate} B/s took {took:.1f}s "
                  f"(a metadata restart included)")
            # a second's burst per metadata server life, then paced
            assert took >= (total - 2 * rate) / rate
            assert status["rebuild"]["passes"] >= 1
    finally:
        cluster.stop()


async def test_removing_a_running_target_drains_it_a_dead_one_is_unrecoverable(
        tmp_path: Path, slow_callbacks) -> None:
    """With one replica, a removed target that still runs is the source of its own
    chunks (drained); a dead one leaves them unrecoverable, the layout kept."""
    cluster = start_cluster(tmp_path, 3, replicas=1, fsck_interval=0)
    try:
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            body = os.urandom(SMALL * 3)
            info = await c.pipe("/one/a.bin", body,
                                layout=LayoutSpec(chunk_size=SMALL, stripe_count=3))
            assert info.layout is not None
            drained = info.layout.targets[1]
            await c.remove_target(drained)
            status = await wait_rebuilt(c)
            assert status["rebuild"]["files_done"] == 1
            assert status["rebuild"]["unrecoverable_count"] == 0
            moved = await c.stat("/one/a.bin", cached=False)
            assert moved.layout is not None and drained not in moved.layout.targets
            assert replicas_on_disk(target_roots(tmp_path, 3), moved) == []
            # now a dead target: nothing to copy from
            b = await c.pipe("/one/b.bin", body, layout=LayoutSpec(chunk_size=SMALL))
            assert b.layout is not None and b.layout.stripe_count == 2
            dead = b.layout.targets[0]
            index = [cluster.target_id(i) for i in range(3)].index(dead)
            await asyncio.to_thread(cluster.stop_data, index)
            await c.remove_target(dead)
            await aeventually(lambda: rebuilt(c, 2), 30, "the second rebuild")
            status = await c.status()
            # a.bin now lives on the two targets left too: both lost a chunk for good
            assert status["rebuild"]["unrecoverable_count"] == 2
            assert sorted(status["rebuild"]["unrecoverable"]) == ["/one/a.bin", "/one/b.bin"]
            after = await c.stat("/one/b.bin", cached=False)
            assert after.layout == b.layout       # the target's data may yet come back
    finally:
        cluster.stop()


@pytest.mark.parametrize("bad", ["no-such-target", "../x"])
async def test_removing_an_unknown_target_is_a_clear_404(cluster, bad: str) -> None:
    async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
        with pytest.raises(FileNotFoundError):
            await c.remove_target(bad)


async def test_a_stalled_server_loses_only_the_targets_still_silent_after_it(
        tmp_path: Path) -> None:
    """The metadata server itself stood still for longer than ``target_timeout`` (a
    paused process, an overloaded machine): every target looks silent at once and is
    marked down.  Lost is counted from then, not from the last heartbeat, so the live
    targets, whose heartbeats come in once it runs again, are up again and never lost;
    the one that stays silent is lost ``target_lost_after`` later.  A clock the test
    moves, over a real SQLite store."""
    now = [1000.0]
    config = load_config({"target_timeout": 10.0, "target_lost_after": 5.0}, env={})
    svc = MetaService(SQLiteStore(tmp_path / "meta.sqlite3"), config, clock=lambda: now[0])
    await svc.start()
    for i in range(3):
        await svc.register_target(TargetInfo(f"t{i}", f"node{i}", f"http://127.0.0.1:{i + 1}",
                                             capacity=1 << 30))
    copier = ChunkCopier(lambda: None, svc.targets.get, rate=1, concurrency=1)  # type: ignore
    rebuilder = Rebuilder(svc, copier, config)

    async def round_after(seconds: float, *alive: str) -> dict[str, str]:
        now[0] += seconds
        for t in alive:
            await svc.heartbeat(t, capacity=1 << 30, used=0, chunks=0)
        svc.refresh_health()
        await rebuilder.check_timeouts()
        return {t.id: t.state for t in svc.list_targets()}

    try:
        assert await round_after(30.0) == {"t0": "down", "t1": "down", "t2": "down"}
        assert await round_after(1.0, "t0", "t1") == {"t0": "up", "t1": "up", "t2": "down"}
        assert await round_after(3.0, "t0", "t1") == {"t0": "up", "t1": "up", "t2": "down"}
        assert await round_after(2.0, "t0", "t1") == {"t0": "up", "t1": "up", "t2": "lost"}
        assert svc.retiring == {"t2"}
    finally:
        svc.close()


def chunks_on_disk(roots: dict[str, Path]) -> dict[str, int]:
    """Chunk files each target holds."""
    return {t: sum(1 for p in (root / "chunks").rglob("*") if p.is_file() and "." in p.name
                   and not p.name.startswith("."))
            for t, root in roots.items()}


async def test_rebuild_spreads_the_copies_over_the_targets_by_free_space(
        tmp_path: Path, slow_callbacks) -> None:
    """Issue 26: every re-copied chunk went to the one target with the most free space
    as last heard (14 → 29 chunks on one node).  Five targets, files striped over two
    of them, one removed: its chunks are copied to the four left, none of which gets
    much more than its fair share."""
    cluster = start_cluster(tmp_path, 5, replicas=2, fsck_interval=0,
                            heartbeat_interval=2.0, target_timeout=20.0)
    try:
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            for i in range(30):
                await c.pipe(f"/spread/f{i}.bin", os.urandom(SMALL * 4),
                             layout=LayoutSpec(chunk_size=SMALL, replicas=2, stripe_count=2))
            roots = target_roots(tmp_path, 5)
            before = chunks_on_disk(roots)
            victim = cluster.target_id(3)
            await c.remove_target(victim)
            status = await wait_rebuilt(c)
            copied = status["rebuild"]["chunks_copied"]
            after = chunks_on_disk(roots)
            gained = {t: after[t] - before[t] for t in roots if t != victim}
            print(f"{copied} chunks copied: {sorted(gained.values())}")
            assert copied >= 20 and sum(gained.values()) == copied
            fair = copied / len(gained)
            assert max(gained.values()) <= fair * 1.5 + 4, gained
            assert min(gained.values()) > 0, gained
            for info in await infos(c, [f"/spread/f{i}.bin" for i in range(30)]):
                assert info.layout is not None and victim not in info.layout.targets
                assert replicas_on_disk(roots, info) == [], info.path
    finally:
        cluster.stop()


async def test_status_says_when_a_down_target_will_be_lost(tmp_path: Path,
                                                          slow_callbacks) -> None:
    """Issue 26: for the ``target_lost_after`` a down target waits, the rebuild said
    only "idle".  ``status`` now gives its ``lost_at`` (when this server first saw it
    down, plus ``target_lost_after``), and ``stager status`` says it."""
    cluster = start_cluster(tmp_path, 3, replicas=2, fsck_interval=0, target_lost_after=600)
    try:
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            assert (await c.status())["lost_at"] == {}
            victim = cluster.target_id(1)
            stopped = time.time()
            await asyncio.to_thread(cluster.stop_data, 1)   # leaves: down at once

            async def waiting() -> bool:
                return victim in (await c.status())["lost_at"]
            await aeventually(waiting, 10, "the down target's lost_at")
            status = await c.status()
            assert list(status["lost_at"]) == [victim]
            at = status["lost_at"][victim]
            assert stopped + 600 <= at <= time.time() + 600, at - stopped
            assert status["rebuild"]["state"] == "idle"
        out = await asyncio.to_thread(stager, cluster.meta_url, "status")
        assert out.returncode == 0, out.stderr
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith(f"target {victim}"))
        assert "declared lost in 59" in line or "declared lost in 600s" in line, line
        row = next(ln for ln in out.stdout.splitlines() if ln.startswith(victim))
        assert "down" in row and "lost in" in row, row
        assert "1/1 metadata servers up" in out.stdout, out.stdout
        assert f"{cluster.meta_url:<30} up    duties  sqlite:" in out.stdout, out.stdout
    finally:
        cluster.stop()


async def test_a_cached_file_on_a_lost_target_is_placed_anew_and_filled_again(
        tmp_path: Path, slow_callbacks) -> None:
    """Issue 28: rebuild copies nothing of a cached file (its source has the bytes):
    its layout leaves the lost target, its chunks are forgotten, and a read fills them
    again on the targets left."""
    src = tmp_path / "src"
    src.mkdir()
    body = os.urandom(3 * SMALL + 7)
    (src / "a.bin").write_bytes(body)
    cluster = start_cluster(tmp_path / "c", 3, replicas=1, target_lost_after=0.5,
                            fsck_interval=0, chunk_size=SMALL)
    try:
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            await c.attach(f"file://{src}", "/view")
            assert await c.cat("/view/a.bin") == body
            before = await c.stat("/view/a.bin", cached=False)
            assert before.layout is not None and before.layout.cached
            victim = before.layout.targets[0]
            await asyncio.to_thread(cluster.stop_data, cluster_index(cluster, victim))
            status = await wait_rebuilt(c)
            assert status["rebuild"]["files_done"] >= 1
            after = await c.stat("/view/a.bin", cached=False)
            assert after.layout is not None and victim not in after.layout.targets
            assert after.layout.cached and after.file_id == before.file_id
            assert await c.cat("/view/a.bin") == body
            assert (await c.fsck())["missing"] == 0
    finally:
        cluster.stop()


def cluster_index(cluster: ThreadCluster, target: str) -> int:
    return next(i for i in range(cluster.n) if cluster.target_id(i) == target)
