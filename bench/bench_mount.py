"""The FUSE mount: sequential reads and ``find``, against the client library and local disk.

Four data servers on 127.0.0.1 (separate processes, no caps) and one
``stager mount`` daemon.  In the same run, round by round:

* one file read front to back: through the mount with 1 MiB ``read()`` calls
  (kernel page cache dropped first, so every byte crosses FUSE and the
  network), through the client library's readahead stream and its parallel
  ``read_into``, through the mount again with the file in the kernel page
  cache, and a local copy of the same bytes from the page cache;
* ``find`` over a tree of small files: through a fresh mount (cold), again
  (names cached by the kernel), the client library's recursive listing, and
  ``find`` over the same tree on local disk.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from stager.testing.mount import Mounted, fuse_unavailable
from stager.testing.nodes import NodeCluster

from .common import (
    MiB,
    aim,
    drain,
    interleaved,
    median,
    new_client,
    r2,
    rate,
    run_async,
    scratch,
    timed,
    upload_file,
    write_local,
)

DATA_SERVERS = 4
BLOCK = MiB
MOUNT_COLD = "mount, 1 MiB read() calls, page cache dropped"
STREAM = "client library, readahead stream"
READ_INTO = "client library, parallel read_into"
MOUNT_WARM = "mount, file in the kernel page cache"
LOCAL = "local file, page cache"
FIND_COLD = "find through a fresh mount"
FIND_WARM = "find again (names cached by the kernel)"
WALK = "client library, recursive listing"
FIND_LOCAL = "find on local disk"


def run(quick: bool) -> dict[str, Any]:
    why = fuse_unavailable()
    if why is not None:
        return {"title": "FUSE mount", "command": _command(quick), "columns": ["case"],
                "rows": [], "ratios": {}, "aims": {}, "notes": [f"skipped: {why}"]}
    size = 256 * MiB if quick else 1024 * MiB
    files = 1_000 if quick else 10_000
    rounds = 2 if quick else 5
    with scratch("mount") as tmp:
        local = write_local(tmp / "data.bin", size)
        with NodeCluster(tmp / "cluster", DATA_SERVERS, mode="loopback") as cluster:
            run_async(_load(cluster.meta_url, local, tmp / "tree", files))
            with Mounted(cluster.meta_url, tmp / "mnt", args=("--read-only",)) as m:
                reads = _reads(cluster.meta_url, m, local, size, rounds)
                stats = m.stats()
            finds = _finds(cluster.meta_url, tmp, files, rounds)
    return _result(reads, finds, stats, size, files, rounds, quick)


def _command(quick: bool) -> str:
    return "python -m bench mount" + (" --quick" if quick else "")


async def _load(meta_url: str, local: Path, tree: Path, files: int) -> None:
    """The big file, and ``files`` empty files in 100-file directories (also on disk)."""
    async with new_client(meta_url) as c:
        await upload_file(c, local, "/data.bin")
        sem = asyncio.Semaphore(32)

        async def one(i: int) -> None:
            rel = f"d{i // 100:03d}/f{i % 100:02d}"
            async with sem:
                await c.pipe(f"/tree/{rel}", b"")
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).touch()

        await asyncio.gather(*(one(i) for i in range(files)))


def _read_fd(path: Path, *, drop: bool) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        if drop:     # forget cached pages: every byte must come through FUSE again
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        buf = bytearray(BLOCK)
        n = 0
        while k := os.readv(fd, [buf]):
            n += k
        return n
    finally:
        os.close(fd)


def _daemon_cpu(pid: int) -> float:
    """User + system CPU seconds of the mount daemon so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _reads(meta_url: str, m: Mounted, local: Path, size: int, rounds: int
           ) -> dict[str, list[tuple[float, float]]]:
    """Each case gives (MB/s, CPU seconds per GB of every process of ours that took part:
    the reader, and the mount daemon when it served the bytes)."""
    out = bytearray(size)
    assert m.pid is not None
    pid = m.pid

    def file_case(path: Path, drop: bool) -> tuple[float, float]:
        cpu, daemon = time.process_time(), _daemon_cpu(pid)
        seconds, n = timed(lambda: _read_fd(path, drop=drop))
        assert n == size
        used = time.process_time() - cpu + _daemon_cpu(pid) - daemon
        return rate(n, seconds), used / (n / 1e9)

    async def client(parallel: bool) -> int:
        async with new_client(meta_url) as c:
            if parallel:
                return await c.read_into("/data.bin", memoryview(out))
            return await drain(c, "/data.bin")

    def client_case(parallel: bool) -> tuple[float, float]:
        cpu = time.process_time()
        seconds, n = timed(lambda: run_async(client(parallel)))
        assert n == size
        return rate(n, seconds), (time.process_time() - cpu) / (n / 1e9)

    before = m.stats()["read_bytes"]
    file_case(m.mountpoint / "data.bin", True)               # warm-up round
    cold_bytes = m.stats()["read_bytes"] - before             # type: ignore[operator]
    assert cold_bytes >= size, f"the cold read was served by a cache ({cold_bytes} B)"
    _read_fd(local, drop=False)
    return interleaved(rounds, {  # type: ignore[dict-item]
        MOUNT_COLD: lambda: file_case(m.mountpoint / "data.bin", True),
        STREAM: lambda: client_case(False),
        READ_INTO: lambda: client_case(True),
        MOUNT_WARM: lambda: file_case(m.mountpoint / "data.bin", False),
        LOCAL: lambda: file_case(local, False),
    })


def _find(root: Path) -> int:
    done = subprocess.run(["find", str(root)], capture_output=True, check=True)
    return done.stdout.count(b"\n")


def _finds(meta_url: str, tmp: Path, files: int, rounds: int) -> dict[str, list[float]]:
    entries = files + -(-files // 100) + 1         # files, their directories, the top

    def mounted() -> tuple[float, float]:
        with Mounted(meta_url, Path(tempfile.mkdtemp(dir=tmp)) / "m",
                     args=("--read-only", "--attr-timeout", "60")) as m:
            cold, n1 = timed(lambda: _find(m.mountpoint / "tree"))
            warm, n2 = timed(lambda: _find(m.mountpoint / "tree"))
        assert n1 == n2 == entries, (n1, n2, entries)
        return entries / cold, entries / warm

    async def walk() -> int:
        async with new_client(meta_url) as c:
            return sum([1 async for _ in c.walk("/tree")])

    def walk_rate() -> float:
        seconds, n = timed(lambda: run_async(walk()))
        assert n == files
        return files / seconds

    out: dict[str, list[float]] = {FIND_COLD: [], FIND_WARM: [], WALK: [], FIND_LOCAL: []}
    for _ in range(rounds):
        cold, warm = mounted()
        out[FIND_COLD].append(cold)
        out[FIND_WARM].append(warm)
        out[WALK].append(walk_rate())
        seconds, n = timed(lambda: _find(tmp / "tree"))
        out[FIND_LOCAL].append(n / seconds)
    return out


def _result(reads: dict[str, list[tuple[float, float]]], finds: dict[str, list[float]],
            stats: dict[str, Any], size: int, files: int, rounds: int,
            quick: bool) -> dict[str, Any]:
    r = {k: median([x for x, _ in v]) for k, v in reads.items()}
    cpu = {k: median([c for _, c in v]) for k, v in reads.items()}
    f = {k: median(v) for k, v in finds.items()}
    client = max(r[STREAM], r[READ_INTO])
    rows = [[name, r2(value), "MB/s", r2(value / r[STREAM]), r2(cpu[name]),
             " / ".join(f"{x:.0f}" for x, _ in reads[name])] for name, value in r.items()]
    rows += [[name, r2(value), "entries/s", r2(value / f[WALK]), None,
              " / ".join(f"{x:.0f}" for x in finds[name])] for name, value in f.items()]
    ratios = {
        "mount / client readahead stream": r2(r[MOUNT_COLD] / r[STREAM]),
        "mount / best client library read": r2(r[MOUNT_COLD] / client),
        "CPU per GB, mount (reader + daemon) / client stream": r2(cpu[MOUNT_COLD] / cpu[STREAM]),
        "mount, page cache / local page cache": r2(r[MOUNT_WARM] / r[LOCAL]),
        "find through the mount, cold / client recursive listing": r2(f[FIND_COLD] / f[WALK]),
        "find through the mount, cold / find on local disk": r2(f[FIND_COLD] / f[FIND_LOCAL]),
    }
    aims = {"mount / client readahead stream": aim(
        r[MOUNT_COLD] / r[STREAM], ">= 0.6", r[MOUNT_COLD] >= 0.6 * r[STREAM])}
    return {
        "title": "FUSE mount: sequential read and find",
        "command": _command(quick),
        "columns": ["case", "median", "unit", "vs client stream / listing", "CPU s/GB",
                    "rounds"],
        "rows": rows, "ratios": ratios, "aims": aims,
        "notes": [
            f"{size // MiB} MiB file (4 MiB chunks) on {DATA_SERVERS} data servers on "
            f"127.0.0.1; median of {rounds} interleaved rounds after a warm-up read.",
            "The mount reads with 1 MiB read() calls after POSIX_FADV_DONTNEED on the file, "
            "so every byte crosses FUSE; the daemon counted "
            f"{stats.get('max_read', 0) // 1024} KiB as its largest read request.",
            "The aim compares like with like: a program reading the file front to back "
            "through the mount, and the client library's sequential reader (the readahead "
            "stream that its file objects use). The parallel read_into of the whole file "
            "into one buffer is faster still; 'mount / best client library read' is "
            "against the faster of the two.",
            "CPU s/GB: CPU time of the reading process, plus the mount daemon's when the "
            "bytes came through the mount (the data servers' is in neither). On a machine "
            "whose cores are all busy the rate follows it.",
            f"find: {files} empty files in directories of 100; 'cold' is the first find "
            "through a new mount, 'again' the second (attribute timeout 60 s).",
            "Every process (servers, daemon, reader) shares this machine's cores.",
        ],
    }
