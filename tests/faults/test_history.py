"""Issue 17: a Jepsen-style history check of the write path under a nemesis.

Writers (asyncio tasks, one client each) overwrite a small pool of shared paths
with ``pipe``, ``put`` (a local file), ``write_many`` and ``open(wb)``, and read
them back, recording every operation in a :class:`~faults.history.History`
(outcome, SHA-256, start and end).  Meanwhile a nemesis injects, one at a time,
in a seeded order: ``kill -9`` of a data server, a hung data server (SIGSTOP:
connections are accepted by the kernel but never answered, so writes hit
``write_timeout`` and route around it; healed by SIGCONT), and ``kill -9`` of the
metadata server; ``stager up --restart`` brings killed servers back.

Afterwards every target is up again, ``fsck --repair`` runs and the repairs
settle; then each path is read once more and :func:`~faults.history.check`
judges every read: no acknowledged write lost, no torn write, no stale bytes.
``fsck`` must be clean and every present file must have all its verified copies
on distinct nodes.  The summary is printed (``pytest -s``) and recorded in the
run's figures.

Length and seed: ``STAGER_HISTORY_SECONDS`` (CI: 30 s of faults, the whole test
well under 3 minutes) and ``STAGER_HISTORY_SEED`` (CI: 17); ``pytest --long``
makes it a 10-minute soak (``STAGER_HISTORY_SECONDS`` still wins).  The seed fixes
every writer's choices (op kinds, paths, sizes, bytes) and the nemesis's schedule;
the interleaving itself depends on timing, as in any real run.
``STAGER_HISTORY_DUMP=FILE`` writes the whole history there, an op or fault a line.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest
from reliability_util import replicas_on_disk, target_roots

from faults.faultlib import SMALL, make_bytes
from faults.history import History, Op, check, format_summary, sha, summary
from stager import AsyncClient
from stager.config import Config, load_config
from stager.errors import StagerError
from stager.protocol.models import LayoutSpec
from stager.testing import ProcessCluster
from stager.testing.cluster import wait_for_targets

pytestmark = pytest.mark.faults
N = 3
WRITERS = 4
PATHS = [f"/h/p{k:02d}.bin" for k in range(12)]
LAYOUT = LayoutSpec(chunk_size=SMALL, replicas=2)
OP_TIMEOUT = 30.0          # a call unanswered this long is recorded as unknown
FAULT_EVERY = 1.0          # seconds from every target up again to the next fault
HANG_FOR = 4.0             # seconds a hung data server stays stopped (> target_timeout)
SETTLE = 60.0              # seconds for targets to come back and repairs to finish
ENV = {"STAGER_WRITE_TIMEOUT": "2", "STAGER_FAILOVER_TIMEOUT": "0.5",
       "STAGER_FSCK_INTERVAL": "0", "STAGER_LOG_LEVEL": "INFO"}
KINDS = ("pipe", "put", "write_many", "open_wb", "read")


def client_config() -> Config:
    """Quick to route around a hung server; no stat cache, so a read sees the
    namespace as of its own request."""
    return load_config({"write_timeout": 2.0, "failover_timeout": 0.5,
                        "stat_cache_ttl": 0.0}, env={})


def run_seconds(config: pytest.Config) -> float:
    default = 600.0 if config.getoption("--long", False) else 30.0
    return float(os.environ.get("STAGER_HISTORY_SECONDS", default))


class Workload:
    """The writers: each its own client, choices from its own seeded generator."""

    def __init__(self, history: History, meta_url: str, tmp: Path) -> None:
        self.history = history
        self.meta_url = meta_url
        self.tmp = tmp
        self.stop = asyncio.Event()
        self.unexpected: list[str] = []      # errors that are not stager's or the OS's

    async def writer(self, w: int) -> None:
        rng = random.Random(f"{self.history.seed}/writer{w}")
        async with AsyncClient(self.meta_url, config=client_config()) as c:
            n = 0
            while not self.stop.is_set():
                kind = rng.choice(KINDS)
                name = f"w{w}"
                if kind == "read":
                    await read(self.history, c, name, rng.choice(PATHS), "read")
                    continue
                count = 3 if kind == "write_many" else 1
                items = []
                for path in rng.sample(PATHS, count):
                    n += 1
                    size = rng.choice([rng.randint(1, SMALL), rng.randint(SMALL, 4 * SMALL)])
                    items.append((path, make_bytes(f"{self.history.seed}/{name}/{n}", size)))
                await self.write(c, name, kind, items)

    async def write(self, c: AsyncClient, name: str, kind: str,
                    items: list[tuple[str, bytes]]) -> None:
        ops = [self.history.begin(name, kind, path, sha(body)) for path, body in items]
        try:
            async with asyncio.timeout(OP_TIMEOUT) as deadline:
                results = await self.call(c, name, kind, items)
        except Exception as exc:
            if not isinstance(exc, StagerError | OSError):
                self.unexpected.append(f"{ops[0]}: {type(exc).__name__}: {exc}")
            outcome = "unknown" if deadline.expired() else "fail"
            for op in ops:
                self.history.finish(op, outcome, f"{type(exc).__name__}: {exc}"[:200])
            return
        # write_many answers per item: the file's info or the error that kept it out
        for op, got in zip(ops, results if kind == "write_many" else [None], strict=True):
            if isinstance(got, StagerError):
                self.history.finish(op, "fail", f"{type(got).__name__}: {got}"[:200])
            else:
                self.history.finish(op, "ack")

    def call(self, c: AsyncClient, name: str, kind: str,
             items: list[tuple[str, bytes]]) -> Awaitable[Any]:
        (path, body), *_ = items
        if kind == "pipe":
            return c.pipe(path, body, layout=LAYOUT)
        if kind == "put":
            local = self.tmp / f"{name}.src"
            local.write_bytes(body)
            return c.put(local, path, layout=LAYOUT)
        if kind == "write_many":
            return c.write_many(items, layout=LAYOUT)
        return write_open(c, path, body)


async def write_open(c: AsyncClient, path: str, body: bytes) -> None:
    f = await c.open(path, "wb", layout=LAYOUT)
    async with f:                                   # type: ignore[union-attr]
        for pos in range(0, len(body), 50_000):
            await f.write(body[pos:pos + 50_000])   # type: ignore[union-attr]


async def read(history: History, c: AsyncClient, name: str, path: str, kind: str) -> None:
    """A read as of its stat: absent only if the namespace says so; a file whose
    chunks cannot be read (during a fault) is a failed read, not an absent one."""
    op = history.begin(name, kind, path)
    try:
        async with asyncio.timeout(OP_TIMEOUT):
            try:
                info = await c.stat(path, cached=False)
            except FileNotFoundError:
                history.finish(op, "ack")
                return
            data = bytes(await c.reader(info).read(0, info.size))
    except (StagerError, OSError) as exc:
        history.finish(op, "fail", f"{type(exc).__name__}: {exc}"[:200])
        return
    history.finish(op, "ack", digest=sha(data))


class Nemesis:
    """One fault at a time, ``FAULT_EVERY`` seconds after every target is up again,
    kinds in seeded rounds (each round every kind once, shuffled), victims seeded
    too."""

    def __init__(self, cluster: ProcessCluster, history: History) -> None:
        self.cluster = cluster
        self.history = history
        self.rng = random.Random(f"{history.seed}/nemesis")
        self.stopped: int | None = None         # the pid of a hung data server

    async def run(self, stop: asyncio.Event) -> None:
        kinds: list[str] = []
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), FAULT_EVERY)
                return
            except TimeoutError:
                pass
            if not kinds:
                kinds = self.rng.sample(["kill9_data", "hang_data", "kill9_meta"], 3)
            await getattr(self, kinds.pop())()
            # One fault at a time: a healed server is taken back (its suspicion by
            # writers expired, its heartbeat seen) before the next fault.
            await asyncio.to_thread(wait_for_targets, self.cluster.meta_url, N, SETTLE,
                                    exact=True)

    async def kill9_data(self) -> None:
        i = self.rng.randrange(N)
        with self.history.fault("kill9_data", f"data{i}"):
            old = self.cluster.data_pid(i)
            self.cluster.kill_data(i)
            await asyncio.to_thread(self.cluster.wait_restarted, "data", i, old)

    async def hang_data(self) -> None:
        i = self.rng.randrange(N)
        with self.history.fault("hang_data", f"data{i}"):
            self.stopped = self.cluster.data_pid(i)
            os.kill(self.stopped, signal.SIGSTOP)
            try:
                await asyncio.sleep(HANG_FOR)
            finally:
                self.heal()

    def heal(self) -> None:
        if self.stopped is not None:
            os.kill(self.stopped, signal.SIGCONT)
            self.stopped = None

    async def kill9_meta(self) -> None:
        with self.history.fault("kill9_meta", "meta"):
            old = int(self.cluster.info["meta"]["pid"])
            self.cluster.kill_meta()
            await asyncio.to_thread(self.cluster.wait_restarted, "meta", 0, old)


async def settle(c: AsyncClient) -> dict[str, Any]:
    """Wait for every target up, run ``fsck --repair`` until nothing is missing and
    the rebuild and repair queues are idle; returns the last repairing fsck."""
    await asyncio.to_thread(wait_for_targets, c.meta_url, N, SETTLE, exact=True)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE
    while True:
        fsck = await c.fsck(repair=True)
        status = await c.status()
        idle = (status["rebuild"]["state"] == "idle" and status["repair"]["pending"] == 0
                and status["targets_lost"] == 0)
        if fsck["missing"] == fsck["repaired"] and not fsck["unreachable"] and idle:
            return fsck
        assert loop.time() < deadline, (fsck, status)
        await asyncio.sleep(0.5)


async def test_history_under_kills_hangs_and_meta_restarts(
        tmp_path: Path, request: pytest.FixtureRequest, figures: dict[str, Any]) -> None:
    history = History(seed=int(os.environ.get("STAGER_HISTORY_SEED", 17)))
    duration = run_seconds(request.config)
    with ProcessCluster(tmp_path / "c", N, replicas=2, restart=True, env=ENV) as cluster:
        work = Workload(history, cluster.meta_url, tmp_path)
        nemesis = Nemesis(cluster, history)
        tasks = [asyncio.ensure_future(work.writer(w)) for w in range(WRITERS)]
        faults = asyncio.ensure_future(nemesis.run(work.stop))
        try:
            await asyncio.sleep(duration)
            work.stop.set()
            await asyncio.gather(faults, *tasks)
        finally:
            nemesis.heal()
        async with AsyncClient(cluster.meta_url, config=client_config()) as c:
            before = await c.fsck()
            repaired = await settle(c)
            for path in PATHS:
                await read(history, c, "checker", path, "final_read")
            fsck = await c.fsck()
            roots = target_roots(cluster.root, N)
            present = [op.path for op in history.ops
                       if op.kind == "final_read" and op.sha256 is not None]
            replicas = [p for path in present
                        for p in replicas_on_disk(roots, await c.stat(path, cached=False))]
    violations = check(history)
    if os.environ.get("STAGER_HISTORY_DUMP"):
        history.dump(os.environ["STAGER_HISTORY_DUMP"])
    report = format_summary(history, violations)
    print("\n" + report)
    figures.update(summary(history, violations), missing_before_repair=before["missing"],
                   repaired=repaired["repaired"], fsck_clean=fsck["clean"],
                   replica_problems=len(replicas), unexpected_errors=len(work.unexpected))
    assert violations == [], report
    assert work.unexpected == [], work.unexpected[:5]
    assert fsck["clean"] and fsck["missing"] == 0, fsck
    assert replicas == [], replicas[:5]
    faulted = {f.kind for f in history.faults}
    assert faulted == {"kill9_data", "hang_data", "kill9_meta"}, (
        f"{duration:.0f} s of faults was too short for every kind: {history.faults}")
    acked = {op.kind for op in history.ops if op.outcome == "ack"}
    assert acked >= {"pipe", "put", "write_many", "open_wb", "read", "final_read"}, acked
    assert present, "no file survived to be checked"


# -- the checker itself must be able to fail -------------------------------------------
def hand_made() -> History:
    """Four paths, each a story: a lost ack, a torn unacked write, a stale read,
    and a path whose history is fine (concurrent acked writes, either may win;
    an unacked write that never showed)."""
    h = History()

    def op(kind: str, path: str, digest: str | None, start: float, end: float,
           outcome: str = "ack") -> None:
        h.ops.append(Op("w", kind, path, digest, start, end, outcome))

    op("pipe", "/lost", sha(b"a"), 0, 1)
    op("final_read", "/lost", None, 5, 6)                          # acked, now absent
    op("put", "/torn", sha(b"whole body"), 0, 2, "fail")
    op("final_read", "/torn", sha(b"whole"), 5, 6)                 # half of it
    op("open_wb", "/stale", sha(b"old"), 0, 1)
    op("write_many", "/stale", sha(b"new"), 2, 3)
    op("read", "/stale", sha(b"old"), 4, 4.5)                      # new was acked first
    op("pipe", "/fine", sha(b"x"), 0, 2)
    op("pipe", "/fine", sha(b"y"), 1, 3)
    op("pipe", "/fine", sha(b"z"), 3.5, 9, "unknown")
    op("read", "/fine", sha(b"x"), 4, 5)
    op("final_read", "/fine", sha(b"x"), 10, 11)
    return h


def test_the_checker_reports_a_lost_ack_a_torn_write_and_a_stale_read() -> None:
    h = hand_made()
    found = {(v.kind, v.read.path) for v in check(h)}
    assert found == {("lost_ack", "/lost"), ("torn", "/torn"), ("stale", "/stale")}
    assert summary(h, check(h))["violations"] == 3
    assert "VIOLATION stale" in format_summary(h, check(h))


def test_the_checker_accepts_every_order_the_history_allows() -> None:
    h = History()
    h.ops += [Op("a", "pipe", "/p", sha(b"1"), 0, 1, "ack"),
              Op("b", "pipe", "/p", sha(b"2"), 2, 3, "fail"),      # may have committed
              Op("c", "read", "/p", None, 0.2, 0.5, "ack"),        # before the ack: absent ok
              Op("c", "read", "/p", sha(b"1"), 4, 5, "ack"),       # 2 not (yet) committed
              Op("c", "read", "/p", sha(b"2"), 6, 7, "ack"),       # 2 committed late
              Op("c", "read", "/q", None, 0, 1, "ack"),
              Op("c", "read", "/p", None, 8, 9, "fail")]           # a failed read says nothing
    assert check(h) == []
    h.ops.append(Op("c", "final_read", "/p", None, 10, 11, "fail"))
    assert [v.kind for v in check(h)] == ["lost_ack"]


def test_a_write_seen_by_a_read_dates_it_for_later_reads() -> None:
    h = History()
    h.ops += [Op("a", "pipe", "/p", sha(b"1"), 0, 1, "ack"),
              Op("b", "pipe", "/p", sha(b"2"), 2, 3, "unknown"),
              Op("c", "read", "/p", sha(b"2"), 4, 5, "ack"),       # 2 committed by 5
              Op("c", "read", "/p", sha(b"1"), 6, 7, "ack")]       # so 1 is gone by 6
    assert [v.kind for v in check(h)] == ["stale"]
