"""Hot paths against their floors: metadata round trips beside a bare aiohttp server.

Issue 30's table, the metadata rows, measured side by side in one run: every
round times every case in turn, and each ratio is taken within its round (the case
over the floor measured in that same round), so a busy machine moves both alike.

- **bare**: an aiohttp server with one route answering ``{}``, under uvloop, in a
  process of its own (as the metadata server runs), hit by an aiohttp client on a
  uvloop loop in this process, one request at a time, keep-alive: the floor of
  any request.
- **health**: ``GET /v1/health`` on a real metadata server (``stager up``'s
  ``ProcessCluster``, SQLite, one data server), same client.  The cluster runs with
  the default heartbeat and collection intervals (2 s, 5 s), as deployed, not the
  test suite's (0.2 s each: ``fast``), whose background work, counted in the server's
  CPU per request, is no part of a request.
- **stat, raw HTTP**: ``GET /v1/stat/PATH`` of a file, same client.
- **stat, AsyncClient**: ``AsyncClient.stat(path, cached=False)`` on the same loop.
- **stat, sync Client**: ``Client.stat(path, cached=False)`` (its loop on a thread).
- **list 1,000 entries**: ``AsyncClient.ls`` of a directory of 1,000 files.
- **1 KiB durable file**: ``AsyncClient.pipe`` of 1 KiB into a new file (create,
  one chunk written and fsynced, commit), against the local floor:
  ``open(O_CREAT)``, write, ``fsync`` the file and its directory.

Besides the wall time, each case's CPU time per operation: the server's (the bare
server's process, or the metadata server's; not the data server's) from
``/proc/PID/stat``, and this process's (the client, its I/O thread included).  On a
machine other work loads, the wall time is mostly waiting for a core; the CPU
time is what a request costs, and moves little with the load.

Not measured here yet (issue 30's other rows): PostgreSQL creates, the Loader's
workers, the first epoch's stall, fsspec against nginx, auth on the small-file path
(``bench auth``), TLS (``bench auth``), a client over 8 network-namespace nodes.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from stager.client.sync import Client
from stager.config import load_config
from stager.testing import ProcessCluster

from .bare_server import BareServer
from .common import median, new_client, paired, quartiles, r2, scratch

LISTED = 1000
SMALL = b"x" * 1024


# (case, floor it is judged against, aim on the ratio or the absolute figure)
AIMS: dict[str, tuple[str, float]] = {
    "health": ("bare", 1.3),
    "stat, raw HTTP": ("bare", 1.6),
    "stat, AsyncClient": ("bare", 1.8),
    "stat, sync Client": ("bare", 2.0),
}
NOT_YET = ("Not measured here yet (issue 30's other rows): PostgreSQL creates, the Loader's "
           "workers, the first epoch's stall, fsspec against nginx, auth on the small-file "
           "path and TLS (bench auth has both), a client over 8 network-namespace nodes.")
LIST_AIM_MS = 5.0
SMALL_AIM_MS = 1.5


TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_of(pid: int) -> float:
    """Seconds of CPU process ``pid`` used so far (user and system), ``nan`` without
    /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / TICK


class Cost:
    """Microseconds per operation over a stretch: wall, the server's CPU, ours."""

    def __init__(self, server: int, n: int) -> None:
        self.server, self.n = server, n

    def __enter__(self) -> Cost:
        self.t0, self.s0, self.c0 = time.perf_counter(), cpu_of(self.server), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        per = 1e6 / self.n
        self.wall = (time.perf_counter() - self.t0) * per
        self.server_cpu = (cpu_of(self.server) - self.s0) * per
        self.client_cpu = (time.process_time() - self.c0) * per


async def per_op(op: Callable[[int], Awaitable[Any]], n: int, server: int) -> Cost:
    """Cost per call of ``op``, one at a time, after a short warm-up."""
    for i in range(min(50, n)):
        await op(i)
    with Cost(server, n) as cost:
        for i in range(n):
            await op(i)
    return cost


def local_small(directory: Path, n: int) -> float:
    """Microseconds per durable 1 KiB file on the local file system."""
    directory.mkdir(parents=True, exist_ok=True)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        start = time.perf_counter()
        for i in range(n):
            fd = os.open(directory / f"f{i:06d}", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            try:
                os.write(fd, SMALL)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.fsync(dfd)
        return (time.perf_counter() - start) / n * 1e6
    finally:
        os.close(dfd)


async def one_round(bare: tuple[str, int], meta: tuple[str, int], n: int, small: int, r: int,
                    local: Path) -> dict[str, Cost | float]:
    (bare_url, bare_pid), (url, pid) = bare, meta
    out: dict[str, Cost | float] = {}
    async with aiohttp.ClientSession() as http, new_client(url) as c:
        async def get(url: str) -> None:
            async with http.get(url) as resp:
                await resp.read()
                assert resp.status == 200, resp.status

        out["bare"] = await per_op(lambda i: get(bare_url), n, bare_pid)
        out["health"] = await per_op(lambda i: get(f"{url}/v1/health"), n, pid)
        out["stat, raw HTTP"] = await per_op(lambda i: get(f"{url}/v1/stat/floors/f"), n, pid)
        out["stat, AsyncClient"] = await per_op(lambda i: c.stat("/floors/f", cached=False), n,
                                                pid)
        lists = max(3, n // 100)
        out["list 1,000 entries"] = await per_op(lambda i: c.ls("/floors/listed"), lists, pid)
        out["1 KiB durable file"] = await per_op(
            lambda i: c.pipe(f"/floors/small{r}/f{i:06d}", SMALL), small, pid)
    out["local 1 KiB durable file"] = local_small(local / f"small{r}", small)
    with Client(url, config=load_config(env={})) as sync:
        for _ in range(50):
            sync.stat("/floors/f", cached=False)
        with Cost(pid, n) as cost:
            for _ in range(n):
                sync.stat("/floors/f", cached=False)
        out["stat, sync Client"] = cost
    return out


async def prepare(meta: str) -> None:
    async with new_client(meta) as c:
        await c.pipe("/floors/f", b"floor")
        await asyncio.gather(*(c.pipe(f"/floors/listed/f{i:04d}", b"")
                               for i in range(LISTED)))


def run(quick: bool) -> dict[str, Any]:
    n = 200 if quick else 3000
    small = 50 if quick else 500
    rounds = 1 if quick else 5
    with scratch("floors") as tmp, BareServer() as server, \
            ProcessCluster(tmp / "cluster", data_servers=1, fast=False) as cluster:
        uvloop.run(prepare(cluster.meta_url))
        figures: dict[str, list[float]] = {}
        cpu: dict[str, list[tuple[float, float]]] = {}
        for r in range(rounds):
            bare = (server.url + "/", server.pid)
            got = uvloop.run(one_round(bare, (cluster.meta_url, cluster.meta_pid()), n, small,
                                       r, tmp / "local"))
            for k, v in got.items():
                if isinstance(v, Cost):
                    figures.setdefault(k, []).append(v.wall)
                    cpu.setdefault(k, []).append((v.server_cpu, v.client_cpu))
                else:
                    figures.setdefault(k, []).append(v)
    return _result(figures, cpu, rounds, n, small, quick)


def _result(figures: dict[str, list[float]], cpu: dict[str, list[tuple[float, float]]],
            rounds: int, n: int, small: int, quick: bool) -> dict[str, Any]:
    rows = []
    ratios: dict[str, float] = {}
    aims: dict[str, Any] = {}
    notes: list[str] = []
    for case, values in figures.items():
        spent = cpu.get(case, [])
        row = [case, r2(median(values)), " / ".join(f"{v:.0f}" for v in values),
               r2(median([s for s, _ in spent])) if spent else "",
               r2(median([c for _, c in spent])) if spent else ""]
        floor = AIMS.get(case, ("", 0.0))[0]
        if floor:
            each = paired(values, figures[floor])
            ratios[f"{case} / {floor}"] = r2(median(each))
            ratios[f"{case} / {floor}, CPU"] = r2(median(paired(
                [s + c for s, c in spent], [s + c for s, c in cpu[floor]])))
            # an upper bound met only when the upper quartile stays under it
            low, high = quartiles(each)
            target = AIMS[case][1]
            aims[f"{case} / {floor}"] = {
                "value": r2(median(each)),
                "aim": f"<= {target} (upper quartile {r2(high)}, spread {r2(low)}-{r2(high)} "
                       f"over {len(each)} rounds)", "met": bool(high <= target)}
        rows.append(row)
    local = paired(figures["1 KiB durable file"], figures["local 1 KiB durable file"])
    ratios["1 KiB durable file / local"] = r2(median(local))
    for case, target_ms in (("list 1,000 entries", LIST_AIM_MS),
                            ("1 KiB durable file", SMALL_AIM_MS)):
        high = quartiles(figures[case])[1] / 1000
        aims[f"{case}, ms"] = {"value": r2(median(figures[case]) / 1000),
                               "aim": f"<= {target_ms} ms (upper quartile {r2(high)})",
                               "met": bool(high <= target_ms)}
    notes.append(f"{rounds} round(s); each round: {n} requests per request case one at a time "
                 f"after 50 unmeasured, {max(3, n // 100)} listings, {small} small files, "
                 "every case in turn; ratios are each round's own, then their median; an "
                 "upper-bound aim is met only when the upper quartile of the rounds is under it. "
                 "CPU: the server's (bare or metadata; not the data server's) and the client "
                 "process's, per operation; the ', CPU' ratios compare their sums.")
    notes.append("Servers: stager.testing.ProcessCluster (one metadata server on SQLite, "
                 "one data server, processes, loopback; default heartbeat and collection "
                 "intervals, fast=False); the bare server a process of its own.")
    notes.append(NOT_YET)
    return {
        "title": "Hot paths against their floors: metadata round trips",
        "command": "python -m bench floors" + (" --quick" if quick else ""),
        "columns": ["case", "us per op (median)", "every round, us",
                    "server CPU us per op (median)", "client CPU us per op (median)"],
        "rows": rows,
        "ratios": ratios,
        "aims": aims,
        "notes": notes,
        "plot": {"kind": "barh", "x": "case", "y": ["us per op (median)"], "logy": True,
                 "ylabel": "microseconds per operation"},
    }
