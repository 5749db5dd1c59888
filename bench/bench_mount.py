"""The FUSE mount: sequential reads and ``find``, against the client library and local disk.

Four data servers on 127.0.0.1 (separate processes, no caps) and one
``stager mount`` daemon.  In the same run, round by round:

* one file read front to back: through the mount with 1 MiB ``read()`` calls
  (kernel page cache dropped first, before the clock starts, so every byte
  crosses FUSE and the network), through the client library's readahead stream and its parallel
  ``read_into``, through the mount again with the file in the kernel page
  cache, and a local copy of the same bytes from the page cache;
* ``find`` over a tree of small files: through a fresh mount (cold), again
  (names cached by the kernel), the client library's recursive listing, and
  ``find`` over the same tree on local disk.
"""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stager.testing.mount import Mounted, fuse_unavailable
from stager.testing.nodes import NodeCluster

from .common import (
    MiB,
    aim,
    cpu_seconds,
    drain,
    drop_cache,
    interleaved,
    median,
    new_client,
    r2,
    rate,
    read_file,
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
    size = 64 * MiB if quick else 1024 * MiB
    files = 300 if quick else 10_000
    rounds = 1 if quick else 5
    with scratch("mount") as tmp:
        local = write_local(tmp / "data.bin", size)
        with NodeCluster(tmp / "cluster", DATA_SERVERS, mode="loopback") as cluster:
            run_async(_load(cluster.meta_url, local, tmp / "tree", files))
            with Mounted(cluster.meta_url, tmp / "mnt", args=("--read-only",)) as m:
                servers = [p.pid for p in cluster.procs]
                reads, drops = _reads(cluster.meta_url, m, servers, local, size, rounds)
                stats = m.stats()
            finds = _finds(cluster.meta_url, tmp, files, rounds)
    return _result(reads, drops, finds, stats, size, files, rounds, quick)


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


def _cpu(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far."""
    return sum(cpu_seconds(pid) for pid in pids)


Case = dict[str, float]      # MB/s, and CPU seconds per GB of each process that took part


def _reads(meta_url: str, m: Mounted, servers: list[int], local: Path, size: int,
           rounds: int) -> tuple[dict[str, list[Case]], list[float]]:
    """Each case, each round: MB/s and CPU s/GB of the reader, the mount daemon (when
    it served the bytes) and the data servers; and the seconds of each page-cache drop."""
    out = bytearray(size)
    assert m.pid is not None
    daemon = [m.pid]
    drops: list[float] = []

    def measured(read: Callable[[], int], via_mount: bool) -> Case:
        cpu, dcpu, scpu = time.process_time(), _cpu(daemon), _cpu(servers)
        seconds, n = timed(read)
        assert n == size
        gb = n / 1e9
        return {"MB/s": rate(n, seconds), "reader": (time.process_time() - cpu) / gb,
                "daemon": (_cpu(daemon) - dcpu) / gb if via_mount else 0.0,
                "servers": (_cpu(servers) - scpu) / gb}

    def file_case(path: Path, drop: bool, via_mount: bool) -> Case:
        if drop:
            drops.append(drop_cache(path))
        return measured(lambda: read_file(path, BLOCK), via_mount)

    async def client(parallel: bool) -> int:
        async with new_client(meta_url) as c:
            if parallel:
                return await c.read_into("/data.bin", memoryview(out))
            return await drain(c, "/data.bin")

    def client_case(parallel: bool) -> Case:
        return measured(lambda: run_async(client(parallel)), False)

    mounted = m.mountpoint / "data.bin"
    before = m.stats()["read_bytes"]
    file_case(mounted, True, True)                            # warm-up round
    cold_bytes = m.stats()["read_bytes"] - before             # type: ignore[operator]
    assert cold_bytes >= size, f"the cold read was served by a cache ({cold_bytes} B)"
    drops.clear()
    read_file(local, BLOCK)
    cases = interleaved(rounds, {  # type: ignore[dict-item]
        MOUNT_COLD: lambda: file_case(mounted, True, True),
        STREAM: lambda: client_case(False),
        READ_INTO: lambda: client_case(True),
        MOUNT_WARM: lambda: file_case(mounted, False, True),
        LOCAL: lambda: file_case(local, False, False),
    })
    return cases, drops  # type: ignore[return-value]


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


def _result(reads: dict[str, list[Case]], drops: list[float],
            finds: dict[str, list[float]], stats: dict[str, Any], size: int, files: int,
            rounds: int, quick: bool) -> dict[str, Any]:
    r = {k: median([c["MB/s"] for c in v]) for k, v in reads.items()}
    split = {k: {p: median([c[p] for c in v]) for p in ("reader", "daemon", "servers")}
             for k, v in reads.items()}
    # The column keeps what it always showed: the reader's CPU, plus the daemon's.
    cpu = {k: s["reader"] + s["daemon"] for k, s in split.items()}
    f = {k: median(v) for k, v in finds.items()}
    client = max(r[STREAM], r[READ_INTO])
    rows = [[name, r2(value), "MB/s", r2(value / r[STREAM]), r2(cpu[name]),
             " / ".join(f"{c['MB/s']:.0f}" for c in reads[name])]
            for name, value in r.items()]
    rows += [[name, r2(value), "entries/s", r2(value / f[WALK]), None,
              " / ".join(f"{x:.0f}" for x in finds[name])] for name, value in f.items()]
    everything = {k: cpu[k] + split[k]["servers"] for k in (MOUNT_COLD, STREAM)}
    ratios = {
        "mount / client readahead stream": r2(r[MOUNT_COLD] / r[STREAM]),
        "mount / best client library read": r2(r[MOUNT_COLD] / client),
        "CPU per GB, mount (reader + daemon) / client stream": r2(cpu[MOUNT_COLD] / cpu[STREAM]),
        "CPU per GB with the servers', client stream / mount":
            r2(everything[STREAM] / everything[MOUNT_COLD]),
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
        "notes": _notes(split, drops, stats, size, files, rounds),
    }


def _notes(split: dict[str, dict[str, float]], drops: list[float], stats: dict[str, Any],
           size: int, files: int, rounds: int) -> list[str]:
    m, c = split[MOUNT_COLD], split[STREAM]
    return [
        f"{size // MiB} MiB file (4 MiB chunks) on {DATA_SERVERS} data servers on "
        f"127.0.0.1; median of {rounds} interleaved rounds after a warm-up read.",
        "The mount reads with 1 MiB read() calls after POSIX_FADV_DONTNEED on the file, "
        "so every byte crosses FUSE; the daemon counted "
        f"{stats.get('max_read', 0) // 1024} KiB as its largest read request. The drop "
        "happens before the clock starts: it is not part of reading (median "
        f"{median(drops):.2f} s for the {size // MiB} MiB, mostly freeing page-cache pages).",
        "The aim compares like with like: a program reading the file front to back "
        "through the mount, and the client library's sequential reader (the readahead "
        "stream that its file objects use). The parallel read_into of the whole file "
        "into one buffer is faster still; 'mount / best client library read' is "
        "against the faster of the two.",
        "CPU s/GB: CPU time of the reading process, plus the mount daemon's when the "
        "bytes came through the mount. With the servers' too (metadata and data, "
        "user + system from /proc), medians: mount: reader "
        f"{m['reader']:.2f}, daemon {m['daemon']:.2f}, servers {m['servers']:.2f}; "
        f"client stream: reader {c['reader']:.2f}, servers {c['servers']:.2f}. "
        "Every process shares this machine's cores, so the rates follow these sums.",
        "Where the mount's extra CPU goes (perf and py-spy on the daemon, "
        "python -m bench.profile_mount): the daemon does what the client's reader does "
        "(recv into chunk buffers, CRC32C) plus the reply to the kernel, a second copy "
        "of every byte, into page-cache pages 4 KiB at a time; the reader's kernel time "
        "allocates those pages (no large folios for FUSE on this kernel) and copies them "
        "out. Chunk buffers on transparent huge pages, reused from file to file, cut the "
        "daemon's CPU per GB by a fifth to a quarter (A/B against the previous daemon in "
        "one run); Python is now under a tenth of the daemon's CPU.",
        "Tried and not kept: direct_io (no page cache; the reader's CPU fell from about "
        "0.22 to 0.05 s/GB, but shared mmap of a file would fail with ENODEV, as "
        "libfuse 3.14 cannot ask for FUSE_DIRECT_IO_ALLOW_MMAP, and nothing read would "
        "stay cached); a 16 MiB kernel readahead (the reader's CPU rose to 0.38 s/GB); "
        "more pyfuse3 worker tasks and fewer readahead chunks (no difference once buffers "
        "were on huge pages). Requests are 1 MiB, the kernel's limit here "
        "(fs.fuse.max_pages_limit = 256 pages), and pyfuse3 has no splice reply.",
        f"find: {files} empty files in directories of 100; 'cold' is the first find "
        "through a new mount, 'again' the second (attribute timeout 60 s).",
    ]
