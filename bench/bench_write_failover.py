"""Writes around a dead server: ``put`` (R=2) with a data server SIGKILLed half way.

Issue 17: a ``put`` must survive the loss of a data server mid-upload and take
less than twice as long as a clean one.  Four data servers, each its own
process (:class:`~stager.testing.ProcessCluster`), two replicas.  The faulted
run watches the client's own per-target ``bytes_written`` and, once half of
the ``size x replicas`` bytes are acknowledged, SIGKILLs the data server that
has received the most (so it is surely in the upload's layout).  The heartbeat
timeout is a minute, so only the writer's own report takes the dead server out:
that is the path measured.  Whole-file retries are off (``write_retries=0``),
so a fallback cannot hide a failed reroute.

Every round starts a fresh cluster (a killed server cannot serve the next
round; startup is not timed) and puts the file twice, clean then faulted, so
the two alternate under the same conditions.  Each file is checked: a streamed
read has the source's SHA-256 and, faulted, its layout excludes the killed
target, which is "suspect" (reported by the writer, not timed out).
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stager import AsyncClient
from stager.protocol.models import FileInfo, LayoutSpec
from stager.testing import ProcessCluster

from .common import (
    GiB,
    MiB,
    aim,
    median,
    new_client,
    r2,
    rate,
    run_async,
    scratch,
    write_local,
)

DATA_SERVERS = 4
REPLICAS = 2
LAYOUT = LayoutSpec(replicas=REPLICAS)
# A minute: no heartbeat timeout can notice the dead server during a put.
ENV = {"STAGER_TARGET_TIMEOUT": "60"}
CLEAN = f"put R={REPLICAS}, clean"
FAULTED = f"put R={REPLICAS}, 1 of {DATA_SERVERS} data servers SIGKILLed at 50%"
POLL = 0.002


@dataclass
class Fault:
    """What one faulted round killed, and when."""

    victim: str
    at_fraction: float          # of size x replicas, acknowledged when the kill was sent
    state: str = ""             # the victim's state at the metadata server after the put
    errors: int = 0             # the client's failed requests to the victim by the kill
    hit: bool = True            # whether the put sent the victim a request after the kill


@dataclass
class Outcome:
    """One put: its time, the file as committed, and what a read of it hashes to."""

    seconds: float
    info: FileInfo
    sha256: str
    fault: Fault | None


async def kill_at_half(client: AsyncClient, put: asyncio.Task[Any], total: int,
                       kill: Callable[[str], None]) -> Fault:
    """SIGKILL the target with the most acknowledged bytes once half of ``total`` is."""
    while not put.done():
        written = {t: c.bytes_written for t, c in client.target_counters().items()}
        done = sum(written.values())
        if done >= total / 2:
            victim = max(written, key=lambda t: written[t])
            kill(victim)
            return Fault(victim, done / total, errors=client.target_counters()[victim].errors)
        await asyncio.sleep(POLL)
    raise RuntimeError("the put finished before half its bytes were counted")


async def streamed_sha256(client: AsyncClient, path: str) -> str:
    info = await client.stat(path, cached=False)
    digest = hashlib.sha256()
    async for piece in client.reader(info).stream():
        digest.update(piece)
    return digest.hexdigest()


async def timed_put(cluster: ProcessCluster, local: Path, faulted: bool) -> Outcome:
    """One put, timed from its start to its commit; ``faulted``: with a kill half way."""
    index = {cluster.target_id(i): i for i in range(cluster.n)}
    path = "/faulted.bin" if faulted else "/clean.bin"
    async with new_client(cluster.meta_url, write_retries=0) as c:
        start = time.perf_counter()
        put = asyncio.ensure_future(c.put(local, path, layout=LAYOUT))
        fault = None
        if faulted:
            total = local.stat().st_size * REPLICAS
            fault = await kill_at_half(c, put, total, lambda t: cluster.kill_data(index[t]))
        [info] = await put
        seconds = time.perf_counter() - start
        if fault is not None:
            states = {t["id"]: t["state"] for t in (await c.status())["targets"]}
            fault.state = states[fault.victim]
            fault.hit = c.target_counters()[fault.victim].errors > fault.errors
        return Outcome(seconds, info, await streamed_sha256(c, path), fault)


class Rounds:
    """Runs each round on a fresh cluster and keeps what the faulted ones showed."""

    def __init__(self, tmp: Path, local: Path) -> None:
        self.tmp = tmp
        self.local = local
        with open(local, "rb") as fh:
            self.sha256 = hashlib.file_digest(fh, "sha256").hexdigest()
        self.size = local.stat().st_size
        self.count = 0
        self.seconds: dict[str, list[float]] = {CLEAN: [], FAULTED: []}
        self.faults: list[Fault] = []

    def round(self, tries: int = 3) -> None:
        """:meth:`one_round`, again on a fresh cluster where the killed server had all
        its chunks acknowledged by the kill (the put sent it nothing after: no failover
        to time; a small --quick file can end so), ``tries`` times at most."""
        for _ in range(tries):
            if self.one_round():
                return
        raise RuntimeError(f"in {tries} rounds the put never wrote to the killed server "
                           "after the kill")

    def one_round(self) -> bool:
        """A fresh cluster, a clean put, then a faulted one; False where the faulted put
        sent the killed server nothing after the kill (nothing kept of that round)."""
        self.count += 1
        root = self.tmp / f"cluster{self.count}"
        try:
            with ProcessCluster(root, DATA_SERVERS, replicas=REPLICAS, env=ENV) as cluster:
                outcomes = [run_async(timed_put(cluster, self.local, faulted))
                            for faulted in (False, True)]
        finally:
            shutil.rmtree(root, ignore_errors=True)   # 4 x size of chunks per round
        clean, faulted = outcomes
        if faulted.fault is not None and not faulted.fault.hit:
            return False
        for outcome in outcomes:
            self.check(outcome)
        self.seconds[CLEAN].append(clean.seconds)
        self.seconds[FAULTED].append(faulted.seconds)
        if faulted.fault is not None:
            self.faults.append(faulted.fault)
        return True

    def check(self, outcome: Outcome) -> None:
        """A figure for a file that is not whole, or not placed around the dead
        server, would be meaningless: fail the benchmark instead."""
        info, fault = outcome.info, outcome.fault
        if info.size != self.size or outcome.sha256 != self.sha256:
            raise RuntimeError(f"the stored file differs from the source ({info.size} bytes, "
                               f"sha256 {outcome.sha256[:12]} vs {self.sha256[:12]})")
        if fault is None:
            return
        if info.layout is None or fault.victim in info.layout.targets:
            raise RuntimeError(f"the faulted file's layout still names {fault.victim}")
        if fault.state != "suspect":
            raise RuntimeError(f"the killed target is {fault.state!r}, not 'suspect': the "
                               "writer did not report it")


def run(quick: bool) -> dict[str, Any]:
    size = 64 * MiB if quick else 1 * GiB
    rounds = 1 if quick else 3
    with scratch("write-failover") as tmp:
        runs = Rounds(tmp, write_local(tmp / "src.bin", size))
        for _ in range(rounds):
            runs.round()
    return _result(runs.seconds, runs.faults, size, rounds, quick)


def _result(seconds: dict[str, list[float]], faults: list[Fault], size: int, rounds: int,
            quick: bool) -> dict[str, Any]:
    clean = median(seconds[CLEAN])
    rows = [[name, r2(median(s)), r2(rate(size, median(s))), r2(median(s) / clean),
             " / ".join(f"{x:.2f}" for x in s)] for name, s in seconds.items()]
    ratio = median(seconds[FAULTED]) / clean
    fractions = ", ".join(f"{f.at_fraction:.2f}" for f in faults)
    return {
        "title": "Writes around a dead server: put with a data server killed mid-upload",
        "command": "python -m bench write_failover" + (" --quick" if quick else ""),
        "columns": ["run", "seconds (median)", "MB/s (median)", "x clean time",
                    "seconds per round"],
        "rows": rows,
        "ratios": {"faulted / clean time": r2(ratio)},
        "aims": {"faulted / clean time": aim(ratio, "< 2", ratio < 2)},
        "notes": [
            f"{size // MiB} MiB file from the page cache, {DATA_SERVERS} data servers as "
            f"processes on loopback (one disk), replicas={REPLICAS}, default chunking, "
            f"write_retries=0; median of {rounds} round(s), clean and faulted alternating, "
            "each round on a fresh cluster (startup not timed), clean put first.",
            f"Faulted: SIGKILL of the data server with the most acknowledged bytes when "
            f"{fractions} of size x replicas were acknowledged; STAGER_TARGET_TIMEOUT=60, "
            "so only the writer's report routes around it.",
            "Every file checked after its put (not timed): a streamed read's SHA-256 "
            "equals the source's; a faulted file's layout excludes the killed target, "
            "which the metadata server lists as 'suspect'.",
        ],
        "plot": {"kind": "barh", "x": "run", "y": ["seconds (median)"], "ylabel": "seconds"},
    }
