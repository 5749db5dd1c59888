"""The prefetch window is bounded in bytes: memory stays under the bound on a
dataset several times larger.  The servers run in another process (``stager
up``), so what is measured here is the loader's memory alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator

import psutil
import pytest

from stager import Client, Loader
from stager.loader import memory
from stager.loader.spans import Spans
from stager.testing import ProcessCluster

pytestmark = pytest.mark.slow      # stager processes: not in make check

MiB = 1 << 20
SAMPLES = 24                 # 24 MiB per dataset, three times the bound
BOUND = 8 * MiB
BATCH = 2 * MiB


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mem")
    block = bytes(range(256)) * (MiB // 256)
    for i in range(SAMPLES):                          # 1 MiB samples: striped reads
        (root / "big").mkdir(exist_ok=True)
        (root / "big" / f"f{i:03d}").write_bytes(block[i:] + block[:i])
    for i in range(8 * SAMPLES):                      # 128 KiB samples: batched requests
        (root / "small").mkdir(exist_ok=True)
        (root / "small" / f"f{i:04d}").write_bytes(block[i % 256:][:128 << 10])
    cluster = ProcessCluster(root / "cluster", data_servers=2)
    cluster.start()
    try:
        with Client(cluster.meta_url) as c:
            c.put(root / "big", "/big", files_in_flight=16)
            c.put(root / "small", "/small", files_in_flight=16)
        yield cluster.meta_url
    finally:
        cluster.stop()


def measure(meta: str, path: str, *, bound: int, batches: int, batch_size: int) -> dict:
    """Read the whole dataset with a slow consumer; peak traced memory and RSS growth."""
    proc = psutil.Process()
    with Loader(path, batch_size=batch_size, meta_url=meta, prefetch_bytes=bound,
                prefetch_batches=batches, drop_last=False) as loader:
        tracemalloc.start()
        try:
            base_traced = tracemalloc.get_traced_memory()[0]
            base_rss = proc.memory_info().rss
            peak_rss = base_rss
            n = 0
            for batch in loader:
                n += sum(len(s["data"]) for s in batch)
                del batch
                time.sleep(0.01)            # the consumer is slower than the reads
                peak_rss = max(peak_rss, proc.memory_info().rss)
            peak_traced = tracemalloc.get_traced_memory()[1] - base_traced
        finally:
            tracemalloc.stop()
        stats = loader.stats()
    return {"bytes": n, "traced": peak_traced, "rss": peak_rss - base_rss,
            "held": stats["peak_prefetch_bytes"]}


@pytest.mark.parametrize(("path", "batch_size"), [("/big", 2), ("/small", 16)])
def test_memory_stays_under_the_prefetch_bound(procs: str, path: str, batch_size: int) -> None:
    """Prefetched data stays under the bound; on top come only the batch in the
    consumer's hands and a read buffer being turned into bytes."""
    tight = measure(procs, path, bound=BOUND, batches=64, batch_size=batch_size)
    assert tight["bytes"] == SAMPLES * MiB
    assert tight["held"] <= BOUND
    assert tight["traced"] < BOUND + BATCH + 2 * MiB, tight
    assert tight["rss"] < BOUND + 32 * MiB, tight
    # the measurement can tell: with a loose bound the same run holds far more
    loose = measure(procs, path, bound=64 * MiB, batches=64, batch_size=batch_size)
    assert loose["held"] >= 2 * BOUND and loose["traced"] > 1.8 * tight["traced"], (tight, loose)


def test_one_batch_larger_than_the_bound_still_goes_through(procs: str) -> None:
    with Loader("/big", batch_size=4, meta_url=procs, prefetch_bytes=MiB) as loader:
        assert sum(len(b) for b in loader) == SAMPLES
        assert loader.stats()["peak_prefetch_bytes"] <= 4 * MiB


@pytest.mark.parametrize("in_flight", [2 * MiB, 64 * MiB])
def test_the_window_is_fetched_in_order_a_few_batches_at_a_time(
        procs: str, monkeypatch: pytest.MonkeyPatch, in_flight: int) -> None:
    """Reads out at once stay under ``bytes_in_flight`` (a batch is 2 MiB here), and
    fetches start in batch order: the next batch does not share its bandwidth with
    the whole window.  With a loose bound the same window is read several batches
    at once.  Batches of large samples are fetched one by one (not grouped)."""
    from stager.loader import fetch

    live = {"now": 0, "peak": 0}
    started: list[list[str]] = []
    read = fetch.Fetcher.fetch

    async def counting(self: fetch.Fetcher, extents: Spans) -> list[bytes]:
        size = extents.nbytes
        started.append([self.files[f].path for f in extents.file.tolist()])
        live["now"] += size
        live["peak"] = max(live["peak"], live["now"])
        try:
            return await read(self, extents)
        finally:
            live["now"] -= size

    monkeypatch.setattr(fetch.Fetcher, "fetch", counting)
    with Loader("/big", batch_size=2, meta_url=procs, shuffle=False, prefetch_batches=12,
                prefetch_bytes=64 * MiB, prefetch_next_epoch=False,
                fetch=fetch.FetchOptions(bytes_in_flight=in_flight)) as loader:
        keys = [s["__key__"] for b in loader for s in b]
    assert keys == sorted(keys) and len(keys) == SAMPLES
    paths = [p for fetched in started for p in fetched]
    assert paths == sorted(paths) and len(paths) == SAMPLES
    assert all(len(fetched) == 2 for fetched in started), started        # a batch each
    if in_flight == 2 * MiB:
        assert live["peak"] <= 2 * MiB, live
    else:
        assert live["peak"] >= 8 * MiB, live


# -- freed memory kept for reuse (stager/loader/memory.py) ----------------------------------
CYCLE = """
import resource
import sys
from stager.loader.memory import keep_freed_memory

size = int(sys.argv[1])

def faults(work):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    work()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

data = memoryview(bytearray(size))

def window():                       # 64 MiB of samples copied out, then freed
    samples = [bytes(data) for _ in range((64 << 20) // size)]
    del samples

window()
plain = faults(window)
kept = keep_freed_memory(256 << 20)
window()                            # faults in what the last one gave back
window()
print(plain, faults(window), kept)
"""


@pytest.mark.skipif(not memory.glibc(), reason="the knob is glibc's (mallopt)")
@pytest.mark.parametrize("size", [16 << 10, 1 << 20])
def test_a_refilled_window_reuses_the_memory_the_last_one_freed(size: int) -> None:
    """Without the knob, glibc hands a freed window back to the kernel (16 KiB
    samples) or maps and unmaps each sample (1 MiB), and the next window faults
    every page in again; with it, the next window reuses them."""
    out = subprocess.run([sys.executable, "-c", CYCLE, str(size)], capture_output=True,
                         text=True, check=True, timeout=120).stdout.split()
    plain, kept_faults, kept = map(int, out)
    pages = (64 << 20) // 4096
    assert plain > pages // 2, out           # the measurement can tell
    assert kept_faults < pages // 20, out
    assert kept == 256 << 20


LOADER = """
import sys
from stager import Loader
from stager.loader import memory
with Loader("/small", batch_size=16, meta_url=sys.argv[1], prefetch_bytes=24 << 20) as loader:
    assert sum(len(b) for b in loader) == 8 * 24
print(memory.kept())
"""


@pytest.mark.skipif(not memory.glibc(), reason="the knob is glibc's (mallopt)")
@pytest.mark.parametrize(("setting", "kept"), [(None, 48 * MiB), ("0", 0)])
def test_a_loader_keeps_twice_its_prefetch_bound_unless_told_not_to(
        procs: str, setting: str | None, kept: int) -> None:
    env = {k: v for k, v in os.environ.items() if k != "STAGER_LOADER_KEEP_FREED"}
    if setting is not None:
        env["STAGER_LOADER_KEEP_FREED"] = setting
    out = subprocess.run([sys.executable, "-c", LOADER, procs], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == kept
