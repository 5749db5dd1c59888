"""Where the read client's CPU goes, per GB: ``python -m bench.profile_cpu [options]``.

Issue 30 asks to count the client's cycles per GB against the floor, one kernel
copy plus CRC32C, and to remove the rest.  This prints that count:

- **floor**: one TCP stream over loopback into a preallocated buffer
  (``recv_into`` in this process, a sender process doing ``sendall``), the
  receiving thread's CPU per GB; and CRC32C over the same buffer, per GB;
- **stager**: a 1 GiB file from four data servers on loopback, read whole with
  ``AsyncClient.read_into`` (``--mode stream``: the readahead stream; ``fsspec``:
  ``open().read(8 MiB)`` through the ``stager://`` filesystem) ``--rounds``
  times, the client's CPU per GB (its process, all threads: the data servers
  and the sender are other processes);
- **where it goes** (``--spy``): the same reads sampled by py-spy (the client
  only, ``--native``), each sample put in one bucket by the frames it holds
  (:data:`BUCKETS`), the buckets' shares times the client's CPU per GB.

The remainder over the floor is what there is to remove; the buckets say which
part of the client holds it.  Run it on a quiet machine: every process here
shares the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import fsspec

from stager.checksum import crc32c
from stager.config import load_config
from stager.testing.nodes import NodeCluster

from .baselines import SENDER, open_read
from .common import MiB, new_client, scratch, upload_file, write_local

# A sample's bucket, from its innermost frames (py-spy --native: C frames too):
# the first rule whose marks appear in the sample's stack wins.
BUCKETS: list[tuple[str, tuple[str, ...]]] = [
    ("CRC32C", ("crc32c",)),
    ("receive copy (recv_into: the kernel's copy)", ("recv_into", "recv (libc", "read (libc",
                                                     "uv__read")),
    ("buffer management (alloc, zero, free)", ("memset", "calloc", "malloc", "free (libc",
                                                "munmap", "mmap", "ReadEngine.take",
                                                "StripedReader.read (")),
    ("thread hand-off (fsspec's sync: wake the loop, wait)", (
        "PyThread_acquire_lock", "PyThread_release_lock", "sem_post", "pthread_cond",
        "uv_async_send", "Condition.wait", "Condition.notify")),
    ("bytes for the caller (b''.join)", ("_fetch_range (stager/fs",)),
    ("other syscalls (request send, sockopt, connect, close)", ("send (libc", "close (libc",
                                                                "setsockopt", "connect",
                                                                "write (libc")),
    ("event loop: epoll", ("epoll", "select (selectors")),
]
LOOP = "event loop: asyncio's Python (callbacks, futures, tasks)"
STAGER = "stager's Python per chunk (plan, engine, rawhttp)"
OTHER = "other"
READING = ("run_forever", "open_read")  # samples of the reads (an event loop running, or
                                        # fsspec's caller), not of start-up


def floor_recv(size: int, out: memoryview) -> float:
    """CPU seconds per GB of the thread receiving one loopback stream into ``out``."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        sender = subprocess.Popen([sys.executable, "-c", SENDER, "127.0.0.1",
                                   str(listener.getsockname()[1]), str(size)])
        try:
            conn, _ = listener.accept()
            with conn:
                got, cpu = 0, time.thread_time()
                while got < size:
                    n = conn.recv_into(out[got:], size - got)
                    if not n:
                        break
                    got += n
                cpu = time.thread_time() - cpu
        finally:
            sender.wait(30)
    return cpu / (got / 1e9)


def floor_crc(out: memoryview) -> float:
    cpu = time.thread_time()
    crc32c(out)
    return (time.thread_time() - cpu) / (len(out) / 1e9)


def reads(meta_url: str, out: memoryview, rounds: int, mode: str) -> list[float]:
    """The client's CPU seconds per GB, each round (``fsspec``: ``open().read(8 MiB)``
    to the end through the ``stager://`` filesystem, as a pandas user reads)."""
    if mode != "fsspec":
        return asyncio.run(stager_reads(meta_url, out, rounds, mode))
    fs = fsspec.filesystem("stager", meta_url=meta_url, config=load_config(env={}),
                           skip_instance_cache=True)
    figures = []
    try:
        for _ in range(rounds):
            cpu = time.process_time()
            n = open_read(fs, "/data.bin")
            figures.append((time.process_time() - cpu) / (n / 1e9))
    finally:
        fs.close()
    return figures


async def stager_reads(meta_url: str, out: memoryview, rounds: int, mode: str) -> list[float]:
    """The client's CPU seconds per GB, each round."""
    figures = []
    async with new_client(meta_url) as c:
        info = await c.stat("/data.bin")
        for _ in range(rounds):
            cpu = time.process_time()
            if mode == "read_into":
                await c.read_into("/data.bin", out)
            else:
                async for _piece in c.reader(info).stream():
                    pass
            figures.append((time.process_time() - cpu) / (len(out) / 1e9))
    return figures


def bucket_of(frames: list[str]) -> str:
    """``frames`` outermost first, as py-spy writes them."""
    stack = ";".join(frames[-4:])      # what runs now, not what called it long ago
    for name, marks in BUCKETS:
        if any(m in stack for m in marks):
            return name
    python = [f for f in frames if ".py:" in f]
    inner = python[-1] if python else ""
    if "stager/" in inner:
        return STAGER
    if "asyncio/" in inner:
        return LOOP
    return OTHER


def read_raw(path: Path) -> tuple[Counter[str], Counter[str]]:
    """py-spy's raw output (``frame;frame;... count``, outermost first), the reads'
    samples only: by bucket, and the innermost frames of those left in stager or other."""
    got: Counter[str] = Counter()
    where: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit() or not any(m in stack for m in READING):
            continue
        frames = stack.split(";")
        bucket = bucket_of(frames)
        got[bucket] += int(count)
        if bucket in (STAGER, OTHER, LOOP):
            where[f"{frames[-1][:90]}"] += int(count)
    return got, where


def spy(meta_url: str, size: int, rounds: int, mode: str, raw: Path) -> list[float]:
    """The reads again in a client process of their own, launched under py-spy (it
    samples that process only: the data servers are not its children)."""
    tool = shutil.which("py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}"
                                       f"{os.environ.get('PATH', '')}") or "py-spy"
    done = subprocess.run([tool, "record", "-r", "250", "--native", "-f", "raw", "-o",
                           str(raw), "--", sys.executable, "-m", "bench.profile_cpu",
                           "--client-of", meta_url, "--size-mib", str(size // MiB),
                           "--rounds", str(rounds), "--mode", mode],
                          capture_output=True, text=True, check=True)
    ours = [line for line in done.stdout.splitlines()
            if line.strip() and not line.startswith("py-spy>")]    # py-spy's own say so
    return [float(x) for x in ours[-1].split()]


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profile_cpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--mode", choices=("read_into", "stream", "fsspec"), default="read_into")
    p.add_argument("--spy", action="store_true", help="also sample the reads with py-spy")
    p.add_argument("--raw", type=Path, help="keep py-spy's raw samples in this file")
    p.add_argument("--client-of", metavar="META_URL", help=argparse.SUPPRESS)
    args = p.parse_args()
    size = args.size_mib * MiB
    out = memoryview(bytearray(size))
    if args.client_of:     # the reads alone, under py-spy: CPU s/GB per round on stdout
        print(*reads(args.client_of, out, args.rounds, args.mode))
        return
    out[:] = os.urandom(1) * size   # faulted in before anything is timed
    recv = sorted(floor_recv(size, out) for _ in range(3))[1]
    crc = sorted(floor_crc(out) for _ in range(3))[1]
    print(f"floor: recv_into {recv:.3f} s/GB + CRC32C {crc:.3f} s/GB = {recv + crc:.3f} s/GB")
    with scratch("profile-cpu") as tmp:
        local = write_local(tmp / "data.bin", size)
        with NodeCluster(tmp / "cluster", 4, mode="loopback") as cluster:
            asyncio.run(_load(cluster.meta_url, local))
            each = reads(cluster.meta_url, out, args.rounds, args.mode)
            mid = sorted(each)[len(each) // 2]
            print(f"stager {args.mode}: client CPU {mid:.3f} s/GB (median of "
                  f"{' / '.join(f'{x:.3f}' for x in each)}); over the floor "
                  f"{mid - recv - crc:+.3f} s/GB, {mid / (recv + crc):.2f}x")
            if args.spy:
                with tempfile.TemporaryDirectory() as d:
                    raw = args.raw or Path(d) / "read.txt"
                    spied = spy(cluster.meta_url, size, args.rounds, args.mode, raw)
                    got, where = read_raw(raw)
                total = sum(got.values()) or 1
                per_gb = sorted(spied)[len(spied) // 2]
                print(f"py-spy ({total} samples of the reads; client CPU {per_gb:.3f} s/GB "
                      "under it, median):")
                for name, n in got.most_common():
                    print(f"  {name:58s} {n / total:6.1%}  {n / total * per_gb:.3f} s/GB")
                print("  innermost frames of the Python buckets:")
                for frame, n in where.most_common(12):
                    print(f"    {n / total:6.1%}  {frame}")


async def _load(meta_url: str, local: Path) -> None:
    async with new_client(meta_url) as c:
        await upload_file(c, local, "/data.bin")


if __name__ == "__main__":
    main()
