"""Scale: what a site's heartbeats and loader telemetry cost one metadata server.

A real metadata server (``stager up --data-servers 0``, SQLite, the default 2 s
heartbeat and 5 s report intervals) is sent, from another process, the chatter of
many simulated machines at their real cadence: N targets heartbeating one request each
(as data servers older than issue 30 do), the same N batched as D data server
processes of T targets each (``POST /v1/heartbeats``), M loader ranks reporting one
request each (``report_rank``), the same M batched per node (``POST /v1/jobs/reports``,
8 ranks a request), and the batched targets and batched ranks together.  For each load the
server's CPU (user + system of its process, from ``/proc``) is read over a window and,
with the idle server's own subtracted, turned into cores per 1,000 targets and per
1,000 ranks; in a second window, the load still on, a foreground client stats a
directory one request at a time, whose p99 under load is set beside the idle one.
The load generator shares this machine's cores with the server and the stat client,
where a site's machines are elsewhere; so its own CPU and the machine's are read over
each window too, and a last load sends the same chatter to a bare sink (an aiohttp
server answering ``{}``) while the stats go to the idle metadata server: that p99 is
the machine's share of the loaded one (the generator's CPU, its wake-ups), the rest is
the metadata server's own.
Where this machine's two shared cores cannot offer the whole rate, the achieved
requests are counted and the cost is per request actually served, scaled to the full
rate (the CPU of a request does not depend on how many others there are, until the
server saturates).
docs/scale.md turns these figures into a 1,000-node site.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import sys
import time
from typing import Any

import aiohttp

from stager.protocol.routes import route
from stager.testing import ProcessCluster

from .bare_server import BareServer
from .common import aim, cpu_seconds, machine_busy, r2, run_async, scratch

HEARTBEAT = 2.0         # seconds: Config.heartbeat_interval's default
REPORT = 5.0            # seconds: Config.report_interval's default
PER_SERVER = 8          # targets per simulated data server process (8 NVMe a node)
PER_NODE = 8            # ranks per node, one report request per node when batched
RANKS_PER_JOB = 1000
STAT_DIR = "/scale"
BOTH = " batched targets + "       # in the name of the combined load, whose p99 the aim reads
SINK_LOAD = "the same load sent to a bare sink (the machine's share)"



def _sizes(quick: bool) -> dict[str, Any]:
    if quick:
        # the rows and their columns, not steady figures: each of the 7 loads waits
        # out its warm-up and two windows
        return {"targets": 160, "single": 160, "ranks": 160, "window": 0.5, "warmup": 0.25}
    return {"targets": 4_000, "single": 1_000, "ranks": 2_000, "window": 10.0,
            "warmup": 8.0}


def run(quick: bool) -> dict[str, Any]:
    size = _sizes(quick)
    # Simulated targets silent between loads must not be marked down: the first beat
    # after that writes each one's state back, a cost of the restart, not the beat.
    env = {"STAGER_TARGET_TIMEOUT": "3600"}
    with scratch("scale") as tmp, ProcessCluster(tmp / "cluster", data_servers=0,
                                                 fast=False, env=env) as cluster, \
            BareServer(sink=True) as sink_server:
        meta, pid = cluster.meta_url, cluster.meta_pid()
        _generate_in_child(meta, {"register": size["targets"]}, 0.0, 0.0)
        run_async(_mkdir(meta))
        loads: list[tuple[str, dict[str, int]]] = [
            ("idle", {}),
            (f"{size['targets']} targets, batched {PER_SERVER} a request",
             {"batched": size["targets"]}),
            (f"{size['single']} targets, one request each", {"single": size["single"]}),
            (f"{size['ranks']} ranks reporting, one request each", {"ranks": size["ranks"]}),
            (f"{size['ranks']} ranks, batched {PER_NODE} a request",
             {"ranks_batched": size["ranks"]}),
            (f"{size['targets']} batched targets + {size['ranks']} batched ranks",
             {"batched": size["targets"], "ranks_batched": size["ranks"]}),
        ]
        measured = []
        for name, load in loads:
            print(f"scale: {name}", file=sys.stderr, flush=True)
            measured.append((name, _phase(meta, pid, load, size)))
        print(f"scale: {SINK_LOAD}", file=sys.stderr, flush=True)
        measured.append((SINK_LOAD, _phase(meta, pid, loads[-1][1], size, to=sink_server.url)))
    return _result(measured, size, quick)


def _phase(meta: str, pid: int, load: dict[str, int], size: dict[str, Any],
           to: str | None = None) -> dict[str, Any]:
    """Start ``load`` in a child process, sent to ``meta`` (or to ``to``); after its
    warm-up, the server's CPU, the child's and the machine's over one window (nothing
    else sent), then the foreground stat latencies over a second (the load still on),
    and the requests the child got answered in the first window."""
    ctx = mp.get_context("spawn")
    queue: Any = ctx.Queue()
    child = None
    if load:
        child = ctx.Process(target=_child, args=(to or meta, load, size["warmup"],
                                                 size["window"], queue), daemon=True)
        child.start()
        queue.get(timeout=120)          # its loop runs: the warm-up begins
        time.sleep(size["warmup"])
    gen0 = cpu_seconds(child.pid) if child is not None and child.pid else 0.0
    cpu0, busy0, t0 = cpu_seconds(pid), machine_busy(), time.monotonic()
    time.sleep(size["window"])
    cpu, busy = cpu_seconds(pid) - cpu0, machine_busy() - busy0
    gen = cpu_seconds(child.pid) - gen0 if child is not None and child.pid else 0.0
    seconds = time.monotonic() - t0
    latencies = run_async(_stats(meta, size["window"]))
    counts: dict[str, int] = {}
    if child is not None:
        counts = queue.get(timeout=600)
        child.join(30)
    return {"cpu_per_second": cpu / seconds, "latencies": latencies, "counts": counts,
            "seconds": seconds, "generator": gen / seconds, "machine": busy / seconds}


async def _mkdir(meta: str) -> None:
    async with aiohttp.ClientSession() as s, s.post(
            route("mkdir").url(meta), json={"path": STAT_DIR, "exist_ok": True}) as resp:
        resp.raise_for_status()


async def _stats(meta: str, window: float) -> list[float]:
    """Stat ``STAT_DIR`` one request at a time for ``window`` seconds: each latency."""
    out: list[float] = []
    url = route("stat").url(meta, path=STAT_DIR)
    async with aiohttp.ClientSession() as s:
        end = time.monotonic() + window
        while time.monotonic() < end:
            start = time.perf_counter()
            async with s.get(url) as resp:
                await resp.read()
                resp.raise_for_status()
            out.append(time.perf_counter() - start)
            await asyncio.sleep(0.002)      # a client's pace, not a flood of its own
    return out


# -- the simulated machines (a child process: their CPU is not the server's) ------------
def _generate_in_child(meta: str, load: dict[str, int], warmup: float, window: float
                       ) -> dict[str, int]:
    ctx = mp.get_context("spawn")
    queue: Any = ctx.Queue()
    child = ctx.Process(target=_child, args=(meta, load, warmup, window, queue), daemon=True)
    child.start()
    queue.get(timeout=120)
    counts: dict[str, int] = queue.get(timeout=600)
    child.join(30)
    return counts


def _child(meta: str, load: dict[str, int], warmup: float, window: float, queue: Any) -> None:
    queue.put("started")
    queue.put(asyncio.run(_generate(meta, load, warmup, window)))


def _target(i: int) -> dict[str, Any]:
    return {"id": f"t-scale{i:05d}", "node": f"sim{i // PER_SERVER:04d}",
            "url": f"http://127.0.0.{1 + i // 40000}:{20000 + i % 40000}",
            "capacity": 4 << 40, "used": 1 << 30, "chunks": 100}


def _beat(i: int) -> dict[str, Any]:
    return {"capacity": 4 << 40, "used": (1 << 30) + i, "chunks": 100,
            "bytes_read": 1 << 20, "bytes_written": 1 << 20}


def _report(rank: int, world: int) -> dict[str, Any]:
    """About what a Loader's report carries (stager/loader/report.py), ~0.6 KiB."""
    return {"interval": REPORT, "world_size": world, "samples": 1000 + rank, "batches": 40,
            "bytes": 1 << 30, "fetches": 300, "epoch": 1, "cursor": 12345,
            "dataset_samples": 1_000_000, "workers": 8, "pid": 4000 + rank,
            "stall_seconds": 0.5, "stall_fraction": 0.01, "waiting_seconds": 0.2,
            "fetch_seconds": 3.0, "decode_seconds": 1.0, "samples_per_second": 2000.0,
            "recent_samples_per_second": 2100.0, "recent_stall_fraction": 0.0,
            "time_to_first_batch": 1.5, "host": f"node{rank // 8:04d}",
            "dataset": "/datasets/imagenet", "format": "tar", "session": "abcd1234",
            "seq": 7, "reports_failed": 0}


async def _generate(meta: str, load: dict[str, int], warmup: float, window: float
                    ) -> dict[str, int]:
    counts = {"requests": 0, "errors": 0, "items": 0, "skipped": 0}
    connector = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=connector) as s:
        if "register" in load:
            sem = asyncio.Semaphore(64)

            async def register(i: int) -> None:
                async with sem, s.post(route("register_target").url(meta),
                                       json=_target(i)) as resp:
                    await resp.read()
                    counts["requests" if resp.status == 200 else "errors"] += 1

            await asyncio.gather(*(register(i) for i in range(load["register"])))
            return counts
        begin = time.monotonic() + 0.1
        measure = (begin + warmup, begin + warmup + window)

        async def every(interval: float, offset: float, send: Any, items: int) -> None:
            k = 0
            while True:
                at = begin + offset + k * interval
                if at > measure[1] + window:     # on through the stat window
                    return
                k += 1
                late = time.monotonic() - at
                if late > interval:     # this machine fell behind: skip, not pile up
                    counts["skipped"] += 1
                    continue
                await asyncio.sleep(max(0.0, -late))
                ok = await send()
                if measure[0] <= time.monotonic() <= measure[1]:
                    counts["requests" if ok else "errors"] += 1
                    counts["items"] += items if ok else 0

        async def post(url: str, body: Any, method: str = "POST") -> bool:
            try:
                async with s.request(method, url, json=body) as resp:
                    await resp.read()
                    return resp.status == 200
            except aiohttp.ClientError:
                return False

        tasks = []
        for i in range(load.get("single", 0)):
            url = route("heartbeat").url(meta, target_id=_target(i)["id"])
            tasks.append(every(HEARTBEAT, HEARTBEAT * i / load["single"],
                               lambda url=url, i=i: post(url, _beat(i)), 1))
        servers = load.get("batched", 0) // PER_SERVER
        for d in range(servers):
            body = {"items": [{"target_id": _target(i)["id"], "heartbeat": _beat(i)}
                              for i in range(d * PER_SERVER, (d + 1) * PER_SERVER)]}
            tasks.append(every(HEARTBEAT, HEARTBEAT * d / servers,
                               lambda body=body: post(route("heartbeats").url(meta), body),
                               PER_SERVER))
        ranks = load.get("ranks", 0)
        for r in range(ranks):
            url = route("report_rank").url(meta, job=f"scale-{r // RANKS_PER_JOB}",
                                           rank=r % RANKS_PER_JOB)
            tasks.append(every(REPORT, REPORT * r / ranks,
                               lambda url=url, r=r: post(url, _report(r, RANKS_PER_JOB),
                                                         "PUT"), 1))
        nodes = load.get("ranks_batched", 0) // PER_NODE
        for n in range(nodes):
            body = {"items": [{"job": f"scale-{r // RANKS_PER_JOB}", "rank": r % RANKS_PER_JOB,
                               "report": _report(r, RANKS_PER_JOB)}
                              for r in range(n * PER_NODE, (n + 1) * PER_NODE)]}
            tasks.append(every(REPORT, REPORT * n / nodes,
                               lambda body=body: post(route("report_ranks").url(meta), body),
                               PER_NODE))
        await asyncio.gather(*tasks)
    return counts


# -- figures -------------------------------------------------------------------------
def _p(latencies: list[float], q: float) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


def _result(measured: list[tuple[str, dict[str, Any]]], size: dict[str, Any],
            quick: bool) -> dict[str, Any]:
    idle = measured[0][1]
    idle_cpu, idle_p99 = idle["cpu_per_second"], _p(idle["latencies"], 0.99)
    rows, per_item = [], {}
    for name, m in measured:
        net = max(0.0, m["cpu_per_second"] - idle_cpu)
        items, requests = m["counts"].get("items", 0), m["counts"].get("requests", 0)
        served = items / m["seconds"] if items else 0.0
        cost_ms = 1000 * net / served if served else 0.0      # CPU ms per item served
        per_item[name] = cost_ms
        # the sink's items cost the (idle) metadata server nothing: no cost to show
        cost = "" if name == SINK_LOAD else r2(cost_ms)
        rows.append([name, r2(requests / m["seconds"]) if requests else 0, r2(served),
                     m["counts"].get("errors", 0), m["counts"].get("skipped", 0),
                     r2(m["cpu_per_second"]), cost,
                     r2(_p(m["latencies"], 0.5)), r2(_p(m["latencies"], 0.99)),
                     r2(m["generator"]), r2(m["machine"])])
    batched, single, ranks, ranks_batched = (per_item[name] for name, _ in measured[1:5])
    per_k_single = single / 1000 * 1000 / HEARTBEAT      # cores per 1,000 targets
    per_k_batched = batched / 1000 * 1000 / HEARTBEAT
    per_k_ranks = ranks / 1000 * 1000 / REPORT
    per_k_ranks_batched = ranks_batched / 1000 * 1000 / REPORT
    # 10,000 targets + 10,000 ranks, both batched per node
    site = 10 * per_k_batched + 10 * per_k_ranks_batched
    site_single_ranks = 10 * per_k_batched + 10 * per_k_ranks
    both, sink = (m for name, m in measured if BOTH in name), dict(measured)[SINK_LOAD]
    both_p99, sink_p99 = _p(next(both)["latencies"], 0.99), _p(sink["latencies"], 0.99)
    # A ratio over a cost /proc's 10 ms ticks did not see (a --quick run's few hundred
    # items) is left out, not written as 0: it was not measured.
    pairs = {"CPU per target, one request each / batched": (single, batched),
             "CPU per rank, one request each / batched": (ranks, ranks_batched),
             "stat p99, batched targets + ranks / idle": (both_p99, idle_p99),
             "stat p99, the same load sent to a sink / idle": (sink_p99, idle_p99)}
    ratios = {name: r2(top / bottom) for name, (top, bottom) in pairs.items() if bottom > 0}
    notes = [
        f"Cores per 1,000 targets (a beat every {HEARTBEAT:g} s): one request each "
        f"{per_k_single:.3f}, batched {PER_SERVER} a request {per_k_batched:.3f}; per "
        f"1,000 ranks (a report every {REPORT:g} s): one request each {per_k_ranks:.3f}, "
        f"batched {PER_NODE} a request {per_k_ranks_batched:.3f}.",
        f"10,000 batched targets + 10,000 ranks batched per node, from the per-item costs: "
        f"{site:.2f} cores (aim <= 0.5); with the ranks one request each "
        f"{site_single_ranks:.2f}.",
        f"Idle server: {idle_cpu:.3f} cores (subtracted); stat p99 idle {idle_p99:.2f} ms.",
        "Offered loads: targets at their real cadence over a "
        f"{size['window']:g} s window after a {size['warmup']:g} s warm-up; where a row "
        "serves fewer items/s than offered, this machine's cores ran out (the load "
        "generator shares them), and the cost is per item served.",
        "The load generator (a process of its own) and the stat client share this "
        "machine's cores with the server, where a site's machines are elsewhere: the "
        "generator's cores and the machine's (every process's, other work included, "
        "from /proc/stat) are columns; the sink row sends the combined load to a bare "
        "aiohttp server while the stats go to the idle metadata server: its p99 over "
        "the idle one is what the generator alone costs the stats here.",
        "Auth off; SQLite store (heartbeats write nothing unless a target's state "
        "changes: target_timeout is an hour here, so none is marked down between loads).",
    ]
    if quick:
        notes.append("--quick: a smoke test at a few hundred targets and ranks.")
    if len(ratios) < len(pairs):
        notes.append("Left out (a cost too small for /proc's ticks): "
                     + ", ".join(sorted(set(pairs) - set(ratios))) + ".")
    p99_ratio = ratios.get("stat p99, batched targets + ranks / idle", 0.0)
    return {
        "title": "Scale: heartbeats and telemetry on one metadata server",
        "columns": ["load", "requests/s", "items/s", "errors", "skipped (late)", "server cores",
                    "CPU ms per item", "stat p50 (ms)", "stat p99 (ms)",
                    "load generator cores", "machine busy cores"],
        "rows": rows,
        "ratios": ratios,
        "aims": {
            "10k targets + 10k ranks (cores)": aim(r2(site), "<= 0.5",
                                                   0 < batched and 0 < ranks_batched
                                                   and site <= 0.5),
            "stat p99 under load / idle": aim(p99_ratio, "<= 2", 0 < p99_ratio <= 2),
        },
        "notes": notes,
        "plot": {"kind": "bar", "x": "load", "y": ["CPU ms per item"],
                 "ylabel": "server CPU ms per target beat or rank report"},
    }


if __name__ == "__main__":        # python -m bench.bench_scale: the figures alone
    import json

    print(json.dumps(run("--quick" in sys.argv), indent=1))
