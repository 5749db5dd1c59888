"""Where the floors' metadata requests spend their time: py-spy on both sides.

``python -m bench.profile_floors MODE [SECONDS]`` starts a ``ProcessCluster`` (one
data server, default intervals as in ``bench floors``), prepares ``bench floors``'
files, then runs one of its cases in a loop for SECONDS while ``py-spy record``
samples the metadata server and this process; it prints the hottest functions of
each side (self time and total), and the rate.

MODE: ``health``, ``stat-raw`` (aiohttp client), ``stat`` (``AsyncClient.stat``),
``sync-stat`` (``Client.stat``), ``list`` (1,000 entries), ``small`` (1 KiB
durable files).  The flame files stay in the printed scratch directory.
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

from .bench_floors import SMALL, prepare
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


def main() -> None:
    mode = sys.argv[1]
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
