"""Issue 27: writes never fail while R nodes are alive.

Five data servers, two replicas, ``stager up --restart`` with its default timings
(``target_timeout`` 10 s, as an operator runs it).  Writers loop on ``pipe`` and
``put`` (of a local file) of 10 KB–9 MB files while

* one data server is killed with SIGKILL every 3 s (restarted by ``stager up``), or
* every data server is stopped with SIGTERM, one at a time (a rolling restart, as
  Kubernetes updates a DaemonSet).

Each kind of fault comes at least five times (five SIGTERMs, five or more SIGKILLs).

At most one server is away at a time, so four nodes always answer: not one write
may fail, and every acknowledged write reads back byte-exact with its copies on
disk.  The counts are printed (``pytest -s``) and recorded in the run's figures.

Lengths: ``STAGER_KILLED_WRITES_SECONDS`` (CI: 21 s of kills).
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import signal
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from reliability_util import replicas_on_disk, target_roots

from faults.faultlib import make_bytes, seconds
from faults.history import sha
from stager import AsyncClient
from stager.config import load_config
from stager.testing import ProcessCluster
from stager.testing.cluster import wait_for_targets

pytestmark = pytest.mark.faults
N = 5
KINDS = ("pipe", "put")


def log_uniform(rng: random.Random, low: int, high: int) -> int:
    """A size from ``low`` to ``high`` bytes, as many small files as large ones per
    decade (10 KB–9 MB averages about 1.3 MB)."""
    return int(low * math.exp(rng.random() * math.log(high / low)))


@dataclass
class Writes:
    """Writers that loop on ``pipe`` and ``put`` of files of their own paths, each
    path written once; what each write came to."""

    meta_url: str
    tmp: Path
    low: int
    high: int
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    acked: dict[str, str] = field(default_factory=dict)        # path → SHA-256
    failed: list[str] = field(default_factory=list)            # "kind path: error"
    counts: Counter[str] = field(default_factory=Counter)      # "kind:outcome"

    async def writer(self, w: int) -> None:
        rng = random.Random(f"writer{w}")
        local = self.tmp / f"w{w}.src"
        async with AsyncClient(self.meta_url, config=load_config(env={})) as c:
            j = 0
            while not self.stop.is_set():
                kind = rng.choice(KINDS)
                path = f"/w{w}/f{j:05d}.bin"
                body = make_bytes(path, log_uniform(rng, self.low, self.high))
                j += 1
                try:
                    if kind == "pipe":
                        await c.pipe(path, body)
                    else:
                        await asyncio.to_thread(local.write_bytes, body)
                        await c.put(local, path)
                except Exception as exc:      # every failure counts, whatever its kind
                    self.counts[f"{kind}:fail"] += 1
                    self.failed.append(f"{kind} {path}: {type(exc).__name__}: {exc}"[:300])
                    continue
                self.counts[f"{kind}:ack"] += 1
                self.acked[path] = sha(body)

    async def check(self, cluster: ProcessCluster) -> tuple[list[str], list[str], int]:
        """(acknowledged writes that read back wrong or not at all, copies missing or
        bad on disk, bytes read back)."""
        bad: list[str] = []
        missing: list[str] = []
        nbytes = 0
        roots = target_roots(cluster.root, N)
        async with AsyncClient(self.meta_url, config=load_config(env={})) as c:
            async def one(path: str, digest: str) -> None:
                nonlocal nbytes
                try:
                    got = await c.cat(path)
                    info = await c.stat(path, cached=False)
                except OSError as exc:
                    bad.append(f"{path}: {type(exc).__name__}: {exc}")
                    return
                nbytes += len(got)
                if sha(got) != digest:
                    bad.append(f"{path}: {len(got)} bytes differ from what was acked")
                missing.extend(await asyncio.to_thread(replicas_on_disk, roots, info))

            items = list(self.acked.items())
            for k in range(0, len(items), 8):
                await asyncio.gather(*(one(path, digest) for path, digest in items[k:k + 8]))
        return bad, missing, nbytes

    def report(self, name: str, faults: int) -> str:
        lines = [f"{name}: {faults} faults, {sum(self.counts.values())} writes, "
                 f"{len(self.acked)} acked, {len(self.failed)} failed"]
        lines += [f"  {k}: {v}" for k, v in sorted(self.counts.items())]
        reasons = Counter(f.split(": ", 1)[1].split(" (")[0][:120] for f in self.failed)
        lines += [f"  FAILED x{n}: {why}" for why, n in reasons.most_common(8)]
        return "\n".join(lines)


async def run_writes(cluster: ProcessCluster, tmp: Path, writers: int, low: int, high: int,
                     nemesis: Any) -> Writes:
    """``writers`` writers until ``nemesis(stop)`` returns, then a last second of writes."""
    work = Writes(cluster.meta_url, tmp, low, high)
    tasks = [asyncio.ensure_future(work.writer(w)) for w in range(writers)]
    try:
        await nemesis(work.stop)
        await asyncio.sleep(1.0)
    finally:
        work.stop.set()
        await asyncio.gather(*tasks)
    return work


async def every(period: float, times: int | None, stop: asyncio.Event | None,
                fault: Any) -> list[str]:
    """``fault()`` every ``period`` seconds, start to start (or right after the last one
    when it took longer), ``times`` times or until ``stop``; what each returned."""
    done: list[str] = []
    loop = asyncio.get_running_loop()
    next_at = loop.time() + period
    while (times is None or len(done) < times) and not (stop and stop.is_set()):
        await asyncio.sleep(max(0.0, next_at - loop.time()))
        next_at = loop.time() + period
        if not (stop and stop.is_set()):
            done.append(await fault())
    return done


async def stop_and_wait(cluster: ProcessCluster, i: int, how: signal.Signals) -> str:
    """Send data server ``i`` ``how``; wait until ``stager up`` started it again."""
    old = cluster.data_pid(i)
    os.kill(old, how)
    took = await asyncio.to_thread(cluster.wait_restarted, "data", i, old)
    return f"data{i} {took:.1f}s"


async def test_kill9_every_3s_fails_no_write(tmp_path: Path, figures: dict[str, Any]) -> None:
    duration = seconds("killed_writes", 21)
    rng = random.Random(27)
    kills: list[str] = []
    with ProcessCluster(tmp_path / "c", N, replicas=2, restart=True, fast=False) as cluster:
        await asyncio.to_thread(wait_for_targets, cluster.meta_url, N, 30)

        async def nemesis(stop: asyncio.Event) -> None:
            loop = asyncio.get_running_loop()
            end = loop.time() + duration
            # Each server once a round, in a shuffled order: the victims before are
            # back (restarted) but were suspect a moment ago.
            victims = iter(i for _ in range(100) for i in rng.sample(range(N), N))
            kill = lambda: stop_and_wait(cluster, next(victims), signal.SIGKILL)  # noqa: E731
            run = asyncio.ensure_future(every(3.0, None, stop, kill))
            await asyncio.sleep(max(0.0, end - loop.time()))
            stop.set()
            kills.extend(await run)

        work = await run_writes(cluster, tmp_path, 4, 10_000, 9_000_000, nemesis)
        bad, missing, nbytes = await work.check(cluster)
    report = work.report("SIGKILL every 3 s", len(kills))
    print("\n" + report + "\n  kills: " + ", ".join(kills))
    figures.update(kills=kills, acked=len(work.acked), failed=len(work.failed),
                   by_kind=dict(work.counts), bytes_read_back=nbytes, bad_reads=len(bad),
                   replica_problems=len(missing))
    assert len(kills) >= max(5, duration // 4), kills   # a kill every 3 s + its restart
    assert len(work.acked) > 5 * len(kills), report       # writes went on between kills
    assert {k.split(":")[0] for k in work.counts} == set(KINDS), report
    assert bad == [], bad[:5]
    assert missing == [], missing[:5]
    assert len(work.failed) == 0, report


async def test_a_rolling_restart_fails_no_write(tmp_path: Path,
                                                figures: dict[str, Any]) -> None:
    """SIGTERM each data server in turn, 3 s apart; 8 writers."""
    restarts: list[str] = []
    with ProcessCluster(tmp_path / "c", N, replicas=2, restart=True, fast=False) as cluster:
        await asyncio.to_thread(wait_for_targets, cluster.meta_url, N, 30)

        async def nemesis(stop: asyncio.Event) -> None:
            order = iter(range(N))
            restarts.extend(await every(3.0, N, None, lambda: stop_and_wait(
                cluster, next(order), signal.SIGTERM)))

        work = await run_writes(cluster, tmp_path, 8, 10_000, 3_000_000, nemesis)
        bad, missing, nbytes = await work.check(cluster)
    report = work.report("rolling restart", len(restarts))
    print("\n" + report + "\n  restarts: " + ", ".join(restarts))
    figures.update(restarts=restarts, acked=len(work.acked), failed=len(work.failed),
                   by_kind=dict(work.counts), bytes_read_back=nbytes, bad_reads=len(bad),
                   replica_problems=len(missing))
    assert len(restarts) == N
    assert len(work.acked) > 5 * len(restarts), report
    assert bad == [], bad[:5]
    assert missing == [], missing[:5]
    assert len(work.failed) == 0, report
