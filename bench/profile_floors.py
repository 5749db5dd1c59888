"""Where the floors' metadata requests spend their time: py-spy on both sides.

``python -m bench.profile_floors MODE [SECONDS]`` starts a ``ProcessCluster`` (one
data server, default intervals as in ``bench floors``), prepares ``bench floors``'
files, then runs one of its cases in a loop for SECONDS while ``py-spy record``
samples the metadata server and this process; it prints the hottest functions of
each side (self time and total), and the rate.

MODE: ``health``, ``stat-raw`` (aiohttp client), ``stat`` (``AsyncClient.stat``),
``sync-stat`` (``Client.stat``), ``list`` (1,000 entries), ``small`` (1 KiB
durable files).  The flame files stay in the printed scratch directory.

``python -m bench.profile_floors timeline [FILES]``: no py-spy; FILES (default 200)
1 KiB durable files untraced, their median wall and each process's CPU per file,
by thread, then 20 under ``strace`` on both servers, one row each
(:mod:`bench.strace_timeline`): which requests, fsyncs and directories a file's
write made, and when.
"""

from __future__ import annotations

import asyncio
import collections
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import uvloop

from stager.client.sync import Client
from stager.config import load_config
from stager.testing import ProcessCluster

from . import strace_timeline
from .bench_floors import SMALL, cpu_of, prepare
from .common import new_client

PY_SPY = Path(sys.executable).with_name("py-spy")


def spy(pid: int, out: Path, seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([str(PY_SPY), "record", "--pid", str(pid), "--rate", "500", "--gil",
                             "--format", "raw", "--duration", str(int(seconds) + 1),
                             "--output", str(out), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def summary(raw: Path, top: int = 25) -> str:
    """The hottest functions of py-spy's collapsed stacks: self and total samples."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        # functions, not lines: "name (file:line)" -> "name (file)"
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        samples += n
        own[frames[-1]] += n
        for f in set(frames):
            total[f] += n
    rows = [f"{samples} samples; self:"]
    rows += [f"  {100 * n / samples:5.1f}%  {f}" for f, n in own.most_common(top)]
    rows.append("total (inclusive):")
    rows += [f"  {100 * n / samples:5.1f}%  {f}" for f, n in total.most_common(top * 2)]
    return "\n".join(rows)


async def load(mode: str, meta: str, seconds: float) -> int:
    done = 0
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as http, new_client(meta) as c:
        async def raw(url: str) -> None:
            async with http.get(url) as resp:
                await resp.read()

        op = {
            "health": lambda i: raw(f"{meta}/v1/health"),
            "stat-raw": lambda i: raw(f"{meta}/v1/stat/floors/f"),
            "stat": lambda i: c.stat("/floors/f", cached=False),
            "list": lambda i: c.ls("/floors/listed"),
            "small": lambda i: c.pipe(f"/floors/prof/f{i:07d}", SMALL),
        }[mode]
        while time.monotonic() < deadline:
            await op(done)
            done += 1
    return done


async def piped(meta: str, n: int, tag: str) -> list[tuple[float, float]]:
    """Pipe ``n`` 1 KiB files one at a time; each one's send and answer, in seconds
    since local midnight (strace's clock)."""
    offset = time.localtime().tm_gmtoff
    marks = []
    async with new_client(meta) as c:
        for i in range(n):
            start = time.time()
            await c.pipe(f"/floors/{tag}/f{i:07d}", SMALL)
            marks.append(((start + offset) % 86400, (time.time() + offset) % 86400))
    return marks


def timeline(files: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="profile-floors-"))
    with ProcessCluster(tmp / "cluster", data_servers=1, fast=False) as cluster:
        pids = {"meta": cluster.meta_pid(), "data": cluster.data_pid(0)}
        uvloop.run(piped(cluster.meta_url, 50, "warm"))
        before = {k: cpu_of(p) for k, p in pids.items()}
        threads = {k: strace_timeline.thread_cpu(p) for k, p in pids.items()}
        client = time.process_time()
        marks = uvloop.run(piped(cluster.meta_url, files, "plain"))
        spent = {k: (cpu_of(p) - before[k]) / files * 1e6 for k, p in pids.items()}
        walls = sorted(b - a for a, b in marks)
        print(f"{files} files untraced: median {walls[files // 2] * 1e3:.2f} ms; CPU per "
              f"file, us: meta {spent['meta']:.0f}, data {spent['data']:.0f}, client "
              f"{(time.process_time() - client) / files * 1e6:.0f} "
              f"(load {os.getloadavg()[0]:.1f})")
        for k, p in pids.items():
            print(f"  {k} by thread, us per file: "
                  + strace_timeline.per_thread(p, threads[k], strace_timeline.thread_cpu(p),
                                               files))
        with strace_timeline.traced(pids, tmp):
            time.sleep(1.0)             # strace attaches
            marks = uvloop.run(piped(cluster.meta_url, 20, "traced"))
            time.sleep(0.5)
    found = strace_timeline.rows(marks, strace_timeline.calls(tmp / "meta.strace"),
                                 strace_timeline.calls(tmp / "data.strace"))
    print(f"under strace (ms after the client's send; logs in {tmp}):")
    print(strace_timeline.table(found))


def main() -> None:
    mode = sys.argv[1]
    if mode == "timeline":
        timeline(int(sys.argv[2]) if len(sys.argv) > 2 else 200)
        return
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    tmp = Path(tempfile.mkdtemp(prefix="profile-floors-"))
    with ProcessCluster(tmp / "cluster", data_servers=1, fast=False) as cluster:
        uvloop.run(prepare(cluster.meta_url))
        server = spy(cluster.meta_pid(), tmp / "server.txt", seconds)
        client = spy(os.getpid(), tmp / "client.txt", seconds)
        time.sleep(1.0)         # py-spy attaches
        if mode == "sync-stat":
            with Client(cluster.meta_url, config=load_config(env={})) as sync:
                done, deadline = 0, time.monotonic() + seconds
                while time.monotonic() < deadline:
                    sync.stat("/floors/f", cached=False)
                    done += 1
        else:
            done = uvloop.run(load(mode, cluster.meta_url, seconds))
        server.wait()
        client.wait()
    print(f"{mode}: {done} in {seconds:.0f} s: {seconds / done * 1e6:.0f} us each "
          f"(load {os.getloadavg()[0]:.1f}); files in {tmp}")
    for side in ("server", "client"):
        print(f"== {side}")
        print(summary(tmp / f"{side}.txt"))


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
