"""What every benchmark needs: scratch space, data, timing, clients, result rows."""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from stager import AsyncClient
from stager.config import load_config
from stager.protocol.models import LayoutSpec

MB = 1_000_000          # rates are in MB/s (10^6 bytes), caps in Mbit/s
KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
PIECE = 8 * MiB


@contextmanager
def scratch(name: str) -> Iterator[Path]:
    """A fresh directory on disk (``$STAGER_BENCH_TMP`` or the system temp), removed after."""
    base = os.environ.get("STAGER_BENCH_TMP") or None
    path = Path(tempfile.mkdtemp(prefix=f"stager-bench-{name}-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def random_blocks(size: int, seed: int = 0, piece: int = PIECE) -> Iterator[bytes]:
    """``size`` pseudo-random bytes in pieces of ``piece`` (incompressible, reproducible)."""
    rng = np.random.default_rng(seed)
    left = size
    while left > 0:
        n = min(piece, left)
        yield rng.bytes(n)
        left -= n


def write_local(path: Path, size: int, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        for block in random_blocks(size, seed):
            fh.write(block)
    return path


def new_client(meta_url: str, **overrides: Any) -> AsyncClient:
    """A client with default settings (the environment ignored), plus ``overrides``."""
    return AsyncClient(meta_url, config=load_config(overrides, env={}))


async def upload_file(client: AsyncClient, local: Path, dst: str, *,
                      layout: LayoutSpec | None = None) -> None:
    """Copy a local file into the cluster (the data the readers then read)."""
    await client.put(local, dst, layout=layout)


async def drain(client: AsyncClient, path: str) -> int:
    """Read a whole file sequentially through the readahead stream; returns bytes."""
    info = await client.stat(path, cached=False)
    n = 0
    async for piece in client.reader(info).stream():
        n += len(piece)
    return n


async def read_all_into(client: AsyncClient, path: str, out: memoryview) -> int:
    """Read a whole file into a preallocated buffer, every chunk in parallel."""
    return await client.read_into(path, out)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


async def atimed(coro: Awaitable[Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = await coro
    return time.perf_counter() - start, value


async def many_timed(op: Callable[[int], Awaitable[Any]], count: int, parallel: int) -> float:
    """Seconds for ``op(0)`` … ``op(count - 1)``, ``parallel`` of them in flight."""
    sem = asyncio.Semaphore(parallel)

    async def one(i: int) -> None:
        async with sem:
            await op(i)

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(count)))
    return time.perf_counter() - start


def interleaved(rounds: int, cases: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Run every case once per round, in turn, so background load hits all alike.

    Each case returns its own figure (e.g. a rate); the lists keep every round.
    """
    out: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, case in cases.items():
            out[name].append(case())
    return out


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def paired(on: list[float], off: list[float]) -> list[float]:
    """Each round's ratio of two modes measured in that round, one after the other."""
    return [a / b for a, b in zip(on, off, strict=True)]


def quartiles(values: list[float]) -> tuple[float, float]:
    """The lower and upper quartiles (the values themselves under four rounds)."""
    if len(values) < 4:
        return min(values), max(values)
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def rate(nbytes: int, seconds: float) -> float:
    """MB/s."""
    return nbytes / seconds / MB if seconds > 0 else float("nan")


def r2(x: float) -> float:
    """Two decimals; under 0.1, two significant digits (a ratio of 0.004 is not 0)."""
    x = float(x)
    if x and math.isfinite(x) and abs(x) < 0.1:
        return float(f"{x:.2g}")
    return round(x, 2)


def aim(value: float, text: str, met: bool) -> dict[str, Any]:
    return {"value": r2(value), "aim": text, "met": bool(met)}


async def async_chunks(size: int, seed: int) -> AsyncIterator[bytes]:
    for block in random_blocks(size, seed):
        yield block
        await asyncio.sleep(0)


def run_async(coro: Awaitable[Any]) -> Any:
    """Run a coroutine on a fresh stock asyncio loop (the client's default)."""
    return asyncio.run(coro)  # type: ignore[arg-type]


# -- processes and files ---------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far, from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> float:
    """CPU seconds all of this machine's cores have been busy so far (user, nice,
    system, irq and softirq time; not idle, iowait or steal), from ``/proc/stat``."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def read_file(path: Path, block: int) -> int:
    """Read the whole file with ``block``-byte reads into one buffer; the bytes read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = bytearray(block)
        n = 0
        while k := os.readv(fd, [buf]):
            n += k
        return n
    finally:
        os.close(fd)


def drop_cache(path: Path) -> float:
    """Forget the file's cached pages (through a mount: every byte must come through
    FUSE again); returns the seconds that took, to keep out of any read's time."""
    fd = os.open(path, os.O_RDONLY)
    try:
        seconds, _ = timed(lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED))
        return seconds
    finally:
        os.close(fd)
