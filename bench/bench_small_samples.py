"""Small samples: many 16 KiB samples read in a shuffled order.

stager keeps the samples packed in one striped file and reads each batch of
256 with one batched request (``POST /v1/read``) per data server
(``DataPlane.batch_read_into`` grouped by target), a few batches in flight.
Baselines, in the same run and the same order: one HTTP request per sample
with fsspec against nginx serving one file per sample (one at a time, and
fsspec's concurrent ``cat`` of a whole batch), and plain reads of the same
per-sample files from the local page cache.
"""

from __future__ import annotations

import asyncio
import io
import random
import tarfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from stager.layout import chunk_targets
from stager.protocol.models import FileInfo, ReadItem, chunk_id
from stager.testing.nodes import NodeCluster

from . import baselines as B
from .common import KiB, new_client, r2, run_async, scratch, upload_file

SAMPLE = 16 * KiB
BATCH = 256
SHARD = 1000
IN_FLIGHT = 4
DATA_SERVERS = 4


def make_dataset(root: Path, n: int, seed: int = 0) -> Path:
    """``n`` samples as one packed file ``packed.bin`` and as ``samples/<i>.bin`` files."""
    rng = random.Random(seed)
    (root / "samples").mkdir(parents=True)
    with open(root / "packed.bin", "wb") as packed:
        for i in range(n):
            data = rng.randbytes(SAMPLE)
            packed.write(data)
            (root / "samples" / f"{i:07d}.bin").write_bytes(data)
    return root / "packed.bin"


async def stager_batched(meta_url: str, order: list[int], check: bytes) -> float:
    """Samples/s reading ``order`` in batches, each one request per target."""
    async with new_client(meta_url) as c:
        info = await c.stat("/packed.bin")
        sem = asyncio.Semaphore(IN_FLIGHT)
        start = time.perf_counter()

        async def batch(ids: list[int]) -> None:
            async with sem:
                bufs = await read_batch(c.plane, info, ids)
            if ids[0] == order[0]:
                _check_first(bufs, check)

        await asyncio.gather(*(batch(order[i:i + BATCH]) for i in range(0, len(order), BATCH)))
        return len(order) / (time.perf_counter() - start)


async def read_batch(plane: Any, info: FileInfo, ids: list[int]) -> dict[str, bytearray]:
    """One ``POST /v1/read`` per target holding any of the samples ``ids``."""
    assert info.layout is not None and info.file_id is not None
    groups: dict[str, list[ReadItem]] = defaultdict(list)
    for i in ids:
        index, offset = divmod(i * SAMPLE, info.layout.chunk_size)
        target = chunk_targets(info.layout, index)[0]
        groups[target].append(ReadItem(chunk_id(info.file_id, index), offset, SAMPLE))
    bufs = {t: bytearray(SAMPLE * len(items)) for t, items in groups.items()}
    await asyncio.gather(*(plane.batch_read_into(t, info.locations[t], items,
                                                 memoryview(bufs[t]))
                           for t, items in groups.items()))
    return bufs


def _check_first(bufs: dict[str, bytearray], first: bytes) -> None:
    if not any(buf[:SAMPLE] == first for buf in bufs.values()):
        raise AssertionError("batched read returned the wrong bytes")


def loader_epoch(meta_url: str) -> tuple[float, int]:
    """Samples/s of one shuffled epoch of stager.Loader over the tar shards, counted from
    constructing the loader (listing, indexing the shards) to the last batch."""
    from stager.loader import Loader

    start = time.perf_counter()
    count = 0
    with Loader("/shards", batch_size=BATCH, format="tar", meta_url=meta_url,
                seed=1) as loader:
        for batch in loader:
            count += len(batch)
    return count / (time.perf_counter() - start), count


def _tar_shards(packed: Path, n: int) -> list[bytes]:
    """The packed samples as WebDataset tar shards of SHARD samples (key = sample id)."""
    shards = []
    with open(packed, "rb") as fh:
        for first in range(0, n, SHARD):
            out = io.BytesIO()
            with tarfile.open(fileobj=out, mode="w") as tar:
                for i in range(first, min(n, first + SHARD)):
                    info = tarfile.TarInfo(f"{i:07d}.bin")
                    info.size = SAMPLE
                    tar.addfile(info, io.BytesIO(fh.read(SAMPLE)))
            shards.append(out.getvalue())
    return shards


def local_files(root: Path, order: list[int]) -> float:
    start = time.perf_counter()
    for i in order:
        with open(root / "samples" / f"{i:07d}.bin", "rb") as fh:
            if len(fh.read()) != SAMPLE:
                raise AssertionError("short sample")
    return len(order) / (time.perf_counter() - start)


def nginx_one_by_one(url: str, order: list[int], budget: float) -> tuple[float, int]:
    """``fs.cat_file`` per sample, for at most ``budget`` seconds; (samples/s, samples)."""
    import fsspec

    fs = fsspec.filesystem("http", skip_instance_cache=True)
    start = time.perf_counter()
    n = 0
    for i in order:
        if len(fs.cat_file(f"{url}/samples/{i:07d}.bin")) != SAMPLE:
            raise AssertionError("short sample")
        n += 1
        if time.perf_counter() - start > budget:
            break
    return n / (time.perf_counter() - start), n


def nginx_concurrent(url: str, order: list[int], budget: float) -> tuple[float, int]:
    """``fs.cat([256 urls])`` per batch (fsspec runs them concurrently)."""
    import fsspec

    fs = fsspec.filesystem("http", skip_instance_cache=True)
    start = time.perf_counter()
    n = 0
    for k in range(0, len(order), BATCH):
        urls = [f"{url}/samples/{i:07d}.bin" for i in order[k:k + BATCH]]
        got = fs.cat(urls)
        if any(len(v) != SAMPLE for v in got.values()):
            raise AssertionError("short sample")
        n += len(urls)
        if time.perf_counter() - start > budget:
            break
    return n / (time.perf_counter() - start), n


def run(quick: bool) -> dict[str, Any]:
    n = 4_000 if quick else 100_000
    budget = 1.0 if quick else 20.0     # --quick: the rows, not steady rates
    order = list(range(n))
    random.Random(1).shuffle(order)
    with scratch("small") as tmp:
        packed = make_dataset(tmp / "www", n)
        first = (tmp / "www" / "samples" / f"{order[0]:07d}.bin").read_bytes()
        with NodeCluster(tmp / "cluster", DATA_SERVERS, mode="loopback") as cluster, \
                B.Nginx(tmp / "www", tmp / "nginx") as nginx:
            run_async(_load(cluster.meta_url, packed, n))
            figures = {
                "stager.Loader, tar shards, one shuffled epoch": loader_epoch(cluster.meta_url),
                "stager batched reads (1 request per target per batch)":
                    (run_async(stager_batched(cluster.meta_url, order, first)), n),
                "local files, one open/read per sample": (local_files(tmp / "www", order), n),
                "nginx + fsspec cat_file, 1 request per sample":
                    nginx_one_by_one(nginx.url, order, budget),
                "nginx + fsspec cat([batch]), 1 request per sample, concurrent":
                    nginx_concurrent(nginx.url, order, budget),
            }
    return _result(figures, n, quick)


async def _load(meta_url: str, packed: Path, n: int) -> None:
    async with new_client(meta_url) as c:
        await upload_file(c, packed, "/packed.bin")
        for k, shard in enumerate(_tar_shards(packed, n)):
            await c.pipe(f"/shards/shard-{k:05d}.tar", shard)


def _result(figures: dict[str, tuple[float, int]], n: int, quick: bool) -> dict[str, Any]:
    head = figures["stager batched reads (1 request per target per batch)"][0]
    rows = [[name, r2(sps), r2(sps * SAMPLE / 1e6), count, r2(sps / head)]
            for name, (sps, count) in sorted(figures.items(), key=lambda kv: -kv[1][0])]
    one = figures["nginx + fsspec cat_file, 1 request per sample"][0]
    conc = figures["nginx + fsspec cat([batch]), 1 request per sample, concurrent"][0]
    local = figures["local files, one open/read per sample"][0]
    loader = figures["stager.Loader, tar shards, one shuffled epoch"][0]
    return {
        "title": f"Small samples: {n:,} samples of 16 KiB in shuffled order",
        "command": "python -m bench small_samples" + (" --quick" if quick else ""),
        "columns": ["reader", "samples/s", "MB/s", "samples read", "x stager"],
        "rows": rows,
        "ratios": {"stager.Loader / nginx+fsspec one by one": r2(loader / one),
                   "stager.Loader / local files": r2(loader / local),
                   "stager / nginx+fsspec one by one": r2(head / one),
                   "stager / nginx+fsspec concurrent": r2(head / conc),
                   "stager / local files": r2(head / local)},
        "aims": {},
        "notes": [
            f"stager: one packed file striped over {DATA_SERVERS} data servers on loopback; "
            f"batches of {BATCH} samples, {IN_FLIGHT} batches in flight, one POST /v1/read "
            "per target per batch; every sample's 64 KiB block is CRC-checked on the "
            "server. Local files and nginx: one 16 KiB file per sample, page cache warm.",
            "The nginx rows stop after their time budget; 'samples read' says how many "
            "they covered (the rate is over those).",
            f"stager.Loader: the same samples as WebDataset tar shards of {SHARD} samples, "
            f"one shuffled epoch (two-level shuffle), batch {BATCH}, default prefetch, "
            "timed from constructing the loader (listing and indexing the shards included) "
            "to its last batch; each sample becomes a dict (key, index, bytes). The "
            "'stager batched reads' row is the batched-read path the Loader is built on, "
            "without planning, decoding or batching. The loader benchmark (python -m bench "
            "loader) adds a simulated training step and the stall it sees.",
            "Client, servers and nginx share this machine's 2 cores; noisy, same run.",
        ],
        "plot": {"kind": "barh", "x": "reader", "y": ["samples/s"], "ylabel": "samples/s"},
    }
