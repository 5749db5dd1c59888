"""Which Python FUSE binding for ``stager mount``: pyfuse3 (asyncio) or mfusepy?

A probe, not a benchmark of stager: each binding serves the same minimal
read-only file system (one file, bytes from memory, or from a real stager
cluster through the client), mounted in a child process; the parent reads the
file once, cold, in 1 MiB ``read()`` calls and reports MiB/s.  Both mounts get
the same kernel readahead (8 MiB, so the kernel asks for 1 MiB per request).
Run as root, with ``pip install mfusepy`` (not a dependency of stager)::

    .venv/bin/python bench/fuse_bindings.py [--size 512MiB] [--source memory|cluster]

docs/mount.md quotes its output.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from stager.mount.runner import mount_entry, tune_readahead

NAME = "data"
READ = 1 << 20
KERNEL_READAHEAD = 8 << 20


def _pattern(size: int) -> bytes:
    block = os.urandom(1 << 20)
    return (block * (size // len(block) + 1))[:size]


class _Source:
    """Bytes of the one file: from memory, or from a stager file through AsyncClient."""

    def __init__(self, size: int, meta_url: str | None) -> None:
        self.size = size
        self.meta_url = meta_url
        self.data = memoryview(_pattern(size)) if meta_url is None else None
        self.client: Any = None
        self.info: Any = None

    async def start(self) -> None:
        if self.meta_url is not None:
            from stager.client import AsyncClient
            self.client = AsyncClient(self.meta_url)
            self.info = await self.client.stat("/probe/" + NAME)
            self.reader = self.client.reader(self.info)

    async def read(self, off: int, size: int) -> bytes | memoryview:
        end = min(self.size, off + size)
        if self.data is not None:
            return self.data[off:end]
        return await self.reader.read(off, end)


def run_pyfuse3(mnt: str, source: _Source) -> None:
    import pyfuse3
    import pyfuse3.asyncio

    pyfuse3.asyncio.enable()

    class Ops(pyfuse3.Operations):
        def _attr(self, ino: int) -> pyfuse3.EntryAttributes:
            a = pyfuse3.EntryAttributes()
            a.st_ino = ino
            a.st_mode = (stat.S_IFDIR | 0o755) if ino == 1 else (stat.S_IFREG | 0o444)
            a.st_size = 0 if ino == 1 else source.size
            a.attr_timeout = a.entry_timeout = 60
            return a

        async def getattr(self, ino, ctx=None):  # noqa: ANN001, ANN201
            return self._attr(ino)

        async def lookup(self, parent, name, ctx=None):  # noqa: ANN001, ANN201
            if name != NAME.encode():
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._attr(2)

        async def open(self, ino, flags, ctx):  # noqa: ANN001, ANN201
            return pyfuse3.FileInfo(fh=ino, keep_cache=True)

        async def read(self, fh, off, size):  # noqa: ANN001, ANN201
            return await source.read(off, size)

    async def main() -> None:
        await source.start()
        opts = set(pyfuse3.default_options) | {"fsname=probe", "ro"}
        pyfuse3.init(Ops(), mnt, opts)
        try:
            await pyfuse3.main(min_tasks=4)
        finally:
            pyfuse3.close(unmount=False)

    try:
        import uvloop
        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


def run_mfusepy(mnt: str, source: _Source) -> None:
    import mfusepy

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    asyncio.run_coroutine_threadsafe(source.start(), loop).result()

    class Ops(mfusepy.Operations):
        use_ns = True

        def getattr(self, path, fh=None):  # noqa: ANN001, ANN201
            if path == "/":
                return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}
            if path == "/" + NAME:
                return {"st_mode": stat.S_IFREG | 0o444, "st_nlink": 1, "st_size": source.size}
            raise mfusepy.FuseOSError(errno.ENOENT)

        def readdir(self, path, fh):  # noqa: ANN001, ANN201
            return [".", "..", NAME]

        def read(self, path, size, offset, fh):  # noqa: ANN001, ANN201
            if source.data is not None:
                return bytes(source.data[offset:offset + size])
            fut = asyncio.run_coroutine_threadsafe(source.read(offset, size), loop)
            return bytes(fut.result())

    mfusepy.FUSE(Ops(), mnt, foreground=True, ro=True, fsname="probe",
                 kernel_cache=True)


def child(binding: str, mnt: str, size: int, meta_url: str | None) -> None:
    source = _Source(size, meta_url)
    {"pyfuse3": run_pyfuse3, "mfusepy": run_mfusepy}[binding](mnt, source)


def _wait_mounted(mnt: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while not os.path.ismount(mnt):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"mount of {mnt} failed (exit {proc.poll()})")
        time.sleep(0.02)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(binding: str, size: int, meta_url: str | None) -> tuple[float, float]:
    """MiB/s of one cold sequential read through a fresh mount, and the file system
    process's CPU seconds per GiB read (steadier than the rate on a busy machine)."""
    with tempfile.TemporaryDirectory() as mnt:
        cmd = [sys.executable, __file__, "--child", binding, "--mnt", mnt, "--size", str(size)]
        if meta_url:
            cmd += ["--meta", meta_url]
        proc = subprocess.Popen(cmd)
        try:
            _wait_mounted(mnt, proc)
            entry = mount_entry(mnt)        # the same kernel readahead for both bindings
            assert entry is not None and tune_readahead(entry.device, KERNEL_READAHEAD)
            buf = bytearray(READ)
            cpu = _cpu_seconds(proc.pid)
            start = time.perf_counter()
            fd = os.open(os.path.join(mnt, NAME), os.O_RDONLY)
            total = 0
            while n := os.readv(fd, [buf]):
                total += n
            os.close(fd)
            secs = time.perf_counter() - start
            cpu = _cpu_seconds(proc.pid) - cpu
            assert total == size, (total, size)
        finally:
            subprocess.run(["fusermount3", "-u", "-z", mnt], check=False)
            proc.wait(10)
    return size / secs / (1 << 20), cpu / (size / (1 << 30))


def _cluster_url(size: int, root: str) -> tuple[Any, str]:
    from stager.client import Client
    from stager.testing import ThreadCluster

    cluster = ThreadCluster(root, 3)
    cluster.start()
    with Client(cluster.meta_url) as client:
        client.pipe("/probe/" + NAME, _pattern(size))
    return cluster, cluster.meta_url


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="512MiB")
    p.add_argument("--source", choices=("memory", "cluster"), default="memory")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--child")
    p.add_argument("--mnt")
    p.add_argument("--meta")
    args = p.parse_args()
    from stager.config import parse_size
    size = parse_size(args.size)
    if args.child:
        child(args.child, args.mnt, size, args.meta)
        return
    with tempfile.TemporaryDirectory() as root:
        cluster, url = _cluster_url(size, root) if args.source == "cluster" else (None, None)
        try:
            runs: dict[str, list[tuple[float, float]]] = {"pyfuse3": [], "mfusepy": []}
            for _ in range(args.runs):              # interleaved: load hits both alike
                for binding, out in runs.items():
                    out.append(measure(binding, size, url))
            for binding, out in runs.items():
                rates, cpus = sorted(r for r, _ in out), sorted(c for _, c in out)
                print(f"{binding:8} source={args.source} size={args.size}: median "
                      f"{rates[len(rates) // 2]:6.0f} MiB/s (runs {[round(r) for r in rates]}), "
                      f"median {cpus[len(cpus) // 2]:.2f} CPU s/GiB in the file system process")
        finally:
            if cluster is not None:
                cluster.stop()


if __name__ == "__main__":
    main()
