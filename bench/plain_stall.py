"""The Loader's stall measured the plain way, as a user would check it.

One Loader, two epochs: the first with no work gives the maximum rate R, the
second sleeps ``batch / (0.8 R)`` after each batch; the stall is the time
blocked in ``next()`` over the wall time, both after the first batch of the
epoch.  It runs on the small-samples benchmark's dataset (16 KiB samples, tar
shards of 1,000, 4 data servers), with the Loader settings of the loader
benchmark's rows.  The benchmark's own method (:func:`bench.bench_loader.measure_all`)
differs: R is the median of separate no-compute runs, and the paced runs are
fresh loaders each reading a part of their first epoch.
"""

from __future__ import annotations

import io
import random
import statistics
import tarfile
from pathlib import Path
from typing import Any

from stager import Client, Loader
from stager.testing.nodes import NodeCluster

from .common import KiB, MiB
from .training_loop import drive

SAMPLE = 16 * KiB
BATCH = 256
SHARD = 1000                  # samples per tar shard, as bench_small_samples
DATA_SERVERS = 4
EPOCH = 1 << 30               # batches: as many as the epoch has
LOADER = {"prefetch_bytes": 256 * MiB, "prefetch_batches": 16}   # as bench_loader's rows


def samples(quick: bool) -> int:
    return 3_000 if quick else 100_000


def runs(quick: bool) -> int:
    return 1 if quick else 3


def write_shards(root: Path, n: int, seed: int = 0) -> Path:
    """``n`` random 16 KiB samples in WebDataset-style tar shards under ``root``."""
    rng = random.Random(seed)
    root.mkdir(parents=True)
    for first in range(0, n, SHARD):
        with tarfile.open(root / f"part-{first // SHARD:04d}.tar", "w") as tar:
            for i in range(first, min(n, first + SHARD)):
                info = tarfile.TarInfo(f"{i:07d}.bin")
                info.size = SAMPLE
                tar.addfile(info, io.BytesIO(rng.randbytes(SAMPLE)))
    return root


def measure(tmp: Path, quick: bool) -> dict[str, Any]:
    """The plain stall, :func:`runs` times with a fresh Loader each: the figures of
    ``bench_loader``'s rows (medians over the runs, each run's listed)."""
    shards = write_shards(tmp / "plain-www", samples(quick))
    with NodeCluster(tmp / "plain-cluster", DATA_SERVERS, mode="loopback") as cluster:
        with Client(cluster.meta_url) as c:
            c.put(shards, "/plain", files_in_flight=8)
        fast: list[dict[str, float]] = []
        paced: list[dict[str, float]] = []
        for r in range(runs(quick)):
            made: list[Loader] = []

            def make(seed: int = r, made: list[Loader] = made) -> Loader:
                made.append(Loader("/plain", meta_url=cluster.meta_url, batch_size=BATCH,
                                   seed=seed, index_cache=tmp / "plain-index", **LOADER))
                return made[0]

            fast.append(drive(make, len, 0.0, EPOCH))                        # epoch 0
            step = BATCH / (0.8 * fast[-1]["rate"])
            with made[0] as loader:
                paced.append(drive(lambda: loader, len, step, EPOCH))       # epoch 1
    return {"rate": statistics.median(f["rate"] for f in fast),
            "rates": [f["rate"] for f in fast],
            "cpu": statistics.median(f["cpu"] for f in fast),
            "ttfb": fast[0]["ttfb"],
            "ttfb_again": (fast[1] if len(fast) > 1 else paced[0])["ttfb"],
            "step": statistics.median(BATCH / (0.8 * f["rate"]) for f in fast),
            "stall": statistics.median(p["stall"] for p in paced),
            "stalls": [p["stall"] for p in paced],
            "paced_rate": statistics.median(p["rate"] for p in paced),
            "late": statistics.median(p["late"] for p in paced),
            "batches": fast[0]["batches"]}
