"""Where a small durable file's time goes: 1 KiB ``pipe``s, one at a time, against a
``stager up`` cluster (one data server, default intervals, as ``bench floors`` runs it).

``python -m bench.profile_small_put [--files N] [--rounds R] [--size BYTES]
[--meta-store URL] [--py-spy FILE]`` prints, per round, the wall time per file and the CPU per file
of the metadata server, the data server and this client (``/proc``), and the
metadata server's split: its event loop's thread and its other threads (the SQLite
store's thread, ``to_thread`` workers), user and kernel time each.  On a machine
other work loads, the wall time is mostly waiting for a core and for the disk (the
local floor of ``bench floors`` moves tenfold with it); the CPU per file moves far
less, so compare versions by it, old and new alternating (or both at once, each
in its own cluster, so that both see the same load)::

    for t in /tmp/old /work/main /tmp/old /work/main; do
        (cd $t && PYTHONPATH=$t python -m bench.profile_small_put --rounds 2); done

``--py-spy FILE`` records the metadata server's stacks during the rounds (py-spy's
raw format, 500 Hz, without pausing it), where the time of its event loop goes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from .common import cpu_seconds, new_client
from .profiling import own_cpu

WARM = 20


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of ``pid``'s main thread (its event loop) and of its other
    threads together, user and kernel time apart (``/proc/PID/task``; a thread that
    ended is not counted, so run this on a server whose threads live on)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = dict.fromkeys(("loop usr", "loop sys", "others usr", "others sys"), 0.0)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(") ", 1)[1].split()
        except FileNotFoundError:
            continue
        who = "loop" if int(task.name) == pid else "others"
        out[f"{who} usr"] += int(fields[11]) / tick
        out[f"{who} sys"] += int(fields[12]) / tick
    return out


async def _pipes(url: str, tag: str, n: int, size: int) -> float:
    """Microseconds per ``pipe`` of ``size`` bytes into a new file, after a warm-up."""
    body = b"x" * size
    async with new_client(url) as c:
        for i in range(WARM):
            await c.pipe(f"/small-put/{tag}/warm{i}", body)
        start = time.perf_counter()
        for i in range(n):
            await c.pipe(f"/small-put/{tag}/f{i:06d}", body)
        return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_small_put")
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--meta-store", default="", help="postgresql://... (default SQLite)")
    parser.add_argument("--py-spy", default="", metavar="FILE",
                        help="record the metadata server's stacks here (py-spy raw format)")
    args = parser.parse_args()
    from stager.testing import ProcessCluster

    with tempfile.TemporaryDirectory(prefix="profile-small-put-") as tmp, \
            ProcessCluster(Path(tmp) / "cluster", data_servers=1, fast=False,
                           meta_store=args.meta_store) as cluster:
        pids = {"meta": cluster.meta_pid(), "data": cluster.data_pid(0)}
        uvloop.run(_pipes(cluster.meta_url, "first", WARM, args.size))
        spy = _py_spy(pids["meta"], args.py_spy) if args.py_spy else None
        for r in range(args.rounds):
            before = {k: cpu_seconds(p) for k, p in pids.items()}
            threads = thread_cpu(pids["meta"])
            mine = own_cpu()
            wall = uvloop.run(_pipes(cluster.meta_url, f"r{r}", args.files, args.size))
            per = 1e6 / (args.files + WARM)
            cpu = {k: (cpu_seconds(p) - before[k]) * per for k, p in pids.items()}
            cpu["client"] = (own_cpu() - mine) * per
            print(f"{args.size} B pipe: {wall:,.0f} us each; CPU us per file: "
                  + ", ".join(f"{k} {v:,.0f}" for k, v in cpu.items())
                  + f"; load {os.getloadavg()[0]:.1f}", flush=True)
            split = {k: (v - threads[k]) * per for k, v in thread_cpu(pids["meta"]).items()}
            print("  meta CPU us per file: " + ", ".join(f"{k} {v:,.0f}"
                                                         for k, v in split.items()), flush=True)
        if spy is not None:
            spy.send_signal(signal.SIGINT)      # py-spy writes its file as it stops
            spy.wait(30)


def _py_spy(pid: int, out: str) -> subprocess.Popen[bytes]:
    """py-spy recording ``pid`` into ``out`` until it is sent SIGINT."""
    exe = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")
    if exe is None:
        raise SystemExit("py-spy is not installed (pip install py-spy)")
    spy = subprocess.Popen([exe, "record", "-p", str(pid), "-r", "500", "-f", "raw", "-o", out,
                            "--nonblocking"], stdout=subprocess.DEVNULL)
    time.sleep(1.0)         # attached before the first round
    return spy


if __name__ == "__main__":
    main()
