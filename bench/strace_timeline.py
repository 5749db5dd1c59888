"""A 1 KiB durable file's timeline across the servers, from ``strace`` (issue 30).

``python -m bench.profile_floors timeline [FILES]`` pipes 1 KiB files one at a time
into a ``ProcessCluster`` while ``strace -f -tt -T`` watches the metadata server and
the data server; this module turns the two logs into one row per file: when (ms
after the client sent it) each step of the write was seen, which fsyncs it waited
on and how long the WAL's took.  strace slows every system call, so the row's
absolute times are inflated; its order and its counts (requests, fsyncs, directories
made) are what it shows.  The untraced wall and CPU per file come first.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CALLS = ("fsync,fdatasync,write,writev,pwrite64,read,openat,rename,renameat2,mkdir,"
         "sendto,recvfrom,sendmsg,recvmsg")
_LINE = re.compile(r"^(\d+)\s+(\d+):(\d+):([\d.]+)\s+(.*?)(?:\s+<([\d.]+)>)?\s*$")


@dataclass(frozen=True)
class Call:
    at: float           # seconds since midnight
    call: str           # the line, without pid and time
    took: float | None  # ms, when strace wrote it on this line


@contextmanager
def traced(pids: dict[str, int], out: Path) -> Iterator[None]:
    """strace each ``name: pid`` into ``out/NAME.strace`` while inside."""
    procs = [subprocess.Popen(["strace", "-f", "-tt", "-T", "-e", f"trace={CALLS}",
                               "-o", str(out / f"{name}.strace"), "-p", str(pid)],
                              stderr=subprocess.DEVNULL) for name, pid in pids.items()]
    try:
        yield
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
            p.wait(30)


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user and system) each thread of ``pid`` used so far."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue            # ended meanwhile
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def per_thread(pid: int, before: dict[int, float], after: dict[int, float], n: int) -> str:
    """Microseconds of CPU per file, by thread (the main thread is the event loop's),
    busiest first."""
    spent = sorted(((after[t] - before.get(t, 0.0)) / n * 1e6, t) for t in after)
    shown = [f"{'loop' if t == pid else t}: {us:.0f}" for us, t in reversed(spent) if us >= 5]
    return ", ".join(shown)


def calls(log: Path) -> list[Call]:
    out = []
    for line in log.read_text().splitlines():
        m = _LINE.match(line)
        if m:
            _, h, mi, s, call, took = m.groups()
            out.append(Call(int(h) * 3600 + int(mi) * 60 + float(s), call,
                            float(took) * 1000 if took else None))
    return out


COLUMNS = ("meta in", "meta -> data", "data in", "dirs made", "chunk open", "data fsyncs",
           "data ack", "meta has ack", "WAL sync", "WAL sync ms", "meta reply", "total")


def rows(marks: list[tuple[float, float]], meta: list[Call], data: list[Call]
         ) -> list[dict[str, float]]:
    """One row per file written between ``marks`` (client's send and answer, seconds
    since midnight): ms after the send at which each step was first seen."""
    out = []
    for start, end in marks:
        m = [c for c in meta if start <= c.at <= end]
        d = [c for c in data if start <= c.at <= end]

        def first(seen: list[Call], pattern: str) -> Call | None:
            return next((c for c in seen if re.search(pattern, c.call)), None)

        def ms(c: Call | None, start: float = start) -> float:
            return (c.at - start) * 1000 if c else float("nan")

        wal = first(m, r"^f(data)?sync\(")
        out.append({
            "meta in": ms(first(m, r'^read\(.*"PUT /v1/files')),
            "meta -> data": ms(first(m, r'"PUT /v1/chunks')),
            "data in": ms(first(d, r'^recvfrom\(.*"PUT /v1/chunks')),
            "dirs made": sum(1 for c in d if c.call.startswith("mkdir(") and "= 0" in c.call),
            "chunk open": ms(first(d, r"^openat\(.*O_EXCL")),
            "data fsyncs": sum(1 for c in d if c.call.startswith("fsync(")),
            "data ack": ms(first(d, r'^sendto\(.*"HTTP/1.1 20')),
            "meta has ack": ms(first(m, r'^read\(.*"HTTP/1.1 20')),
            "WAL sync": ms(wal),
            "WAL sync ms": _took(m, wal),
            "meta reply": ms(first(m, r'^write\(.*"HTTP/1.1 20')),
            "total": (end - start) * 1000,
        })
    return out


def _took(seen: list[Call], call: Call | None) -> float:
    """A call's duration: on its line, or on its ``resumed`` line (another thread
    interrupted it in the log)."""
    if call is None:
        return float("nan")
    if call.took is not None:
        return call.took
    name = call.call.split("(", 1)[0]
    resumed = next((c for c in seen if c.at >= call.at and f"<... {name} resumed>" in c.call),
                   None)
    return resumed.took if resumed and resumed.took is not None else float("nan")


def table(found: list[dict[str, float]], shown: int = 5) -> str:
    """The first ``shown`` rows and the median of each column."""
    head = " ".join(f"{c:>12}" for c in COLUMNS)
    lines = [head]
    for r in found[:shown]:
        lines.append(" ".join(f"{r[c]:12.2f}" for c in COLUMNS))
    med = {c: statistics.median([r[c] for r in found if r[c] == r[c]] or [float("nan")])
           for c in COLUMNS}
    lines.append(" ".join(f"{med[c]:12.2f}" for c in COLUMNS) + "   (median)")
    return "\n".join(lines)
