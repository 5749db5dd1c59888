"""``make demo``: a local cluster, a 1 GB sample dataset written in and read back.

Starts ``stager up`` with 4 data servers under ``./.stager``, generates a
WebDataset-style sample dataset (16 tar shards of 64 MiB; reused when present),
writes it into the cluster, reads it back in parallel (every chunk checked
against its CRC32C), feeds one shuffled epoch of it to a simulated training
loop through ``stager.Loader``, prints what each target served, and shuts the
cluster down.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import tarfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .client import AsyncClient
from .config import load_config
from .protocol.models import FileInfo
from .testing.cluster import ProcessCluster

SHARDS = 16
SHARD_BYTES = 64 << 20
SAMPLE_BYTES = 256 << 10

console = Console()


def make_dataset(root: Path, shards: int, shard_bytes: int) -> list[Path]:
    """Tar shards of (``.bin``, ``.json``) samples; kept and reused across runs."""
    root.mkdir(parents=True, exist_ok=True)
    marker = root / "dataset.json"
    spec = {"shards": shards, "shard_bytes": shard_bytes, "sample_bytes": SAMPLE_BYTES}
    files = [root / f"shard-{i:05d}.tar" for i in range(shards)]
    if marker.exists() and json.loads(marker.read_text()) == spec and all(
            f.exists() for f in files):
        return files
    rng = random.Random(0)
    per_shard = shard_bytes // SAMPLE_BYTES
    for i, path in enumerate(files):
        with tarfile.open(path, "w") as tar:
            for j in range(per_shard):
                key = f"{i:05d}{j:05d}"
                _add(tar, f"{key}.bin", os.urandom(SAMPLE_BYTES - 1024))
                _add(tar, f"{key}.json", json.dumps({"label": rng.randrange(1000)}).encode())
    marker.write_text(json.dumps(spec))
    return files


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


async def write_and_read(meta_url: str, src: Path, dst: str) -> dict[str, object]:
    async with AsyncClient(meta_url, config=load_config()) as client:
        start = time.perf_counter()
        infos = await client.put(src, dst, files_in_flight=4)
        write_s = time.perf_counter() - start
        files = [i for i in infos if i.path.endswith(".tar")]
        total = sum(i.size for i in files)
        written = {t: c.bytes_written for t, c in client.target_counters().items()}

        async def read(info: FileInfo) -> int:
            n = 0
            async for piece in client.reader(info).stream():
                n += len(piece)
            return n

        start = time.perf_counter()
        sizes = await asyncio.gather(*(read(i) for i in files))
        read_s = time.perf_counter() - start
        if sum(sizes) != total:
            raise RuntimeError(f"read {sum(sizes)} bytes, wrote {total}")
        counters = client.target_counters()
        targets = {t.id: t for t in await client.targets()}
        return {"files": len(files), "bytes": total, "write_s": write_s, "read_s": read_s,
                "per_target": [
                    (tid, targets[tid].node if tid in targets else "?", written.get(tid, 0),
                     c.bytes_read) for tid, c in sorted(counters.items())]}


def train_epoch(meta_url: str, dataset: str, step_seconds: float) -> dict[str, float]:
    """One shuffled epoch of the tar shards through the Loader, ``step_seconds`` per batch."""
    from .loader import Loader

    with Loader(dataset, batch_size=32, format="tar", meta_url=meta_url, seed=0) as loader:
        samples = 0
        for batch in loader:
            samples += len(batch)
            time.sleep(step_seconds)          # the "GPU" working on the batch
        stats = loader.stats()
    return {"samples": samples, "samples_per_second": stats["samples_per_second"],
            "stall_fraction": stats["stall_fraction"],
            "time_to_first_batch": stats["time_to_first_batch"]}


def report_training(result: dict[str, float], step_seconds: float) -> None:
    table = Table(title=f"one epoch through stager.Loader ({step_seconds * 1e3:.0f} ms/batch)")
    for col in ("samples", "samples/s", "first batch", "stall"):
        table.add_column(col, justify="right")
    table.add_row(str(result["samples"]), f"{result['samples_per_second']:.0f}",
                  f"{result['time_to_first_batch']:.2f} s",
                  f"{result['stall_fraction'] * 100:.1f} %")
    console.print(table)
    console.print("stall = the share of the loop spent waiting for data.")


def report(result: dict[str, object]) -> None:
    gb = result["bytes"] / 1e9  # type: ignore[operator]
    table = Table(title="stager demo (4 data servers)")
    for col in ("files", "GB", "write GB/s", "read GB/s"):
        table.add_column(col, justify="right")
    table.add_row(str(result["files"]), f"{gb:.2f}", f"{gb / result['write_s']:.2f}",  # type: ignore[operator]
                  f"{gb / result['read_s']:.2f}")  # type: ignore[operator]
    console.print(table)
    per = Table(title="bytes per target")
    for col in ("target", "node", "written MB", "read MB"):
        per.add_column(col, justify="right")
    for tid, node, written, read in result["per_target"]:  # type: ignore[attr-defined]
        per.add_row(tid, node, f"{written / 1e6:.0f}", f"{read / 1e6:.0f}")
    console.print(per)
    console.print("reads were checked chunk by chunk against their CRC32C; the data "
                  "servers' page cache was warm (the data was just written).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", default=".stager")
    parser.add_argument("--shards", type=int, default=SHARDS)
    parser.add_argument("--shard-mib", type=int, default=SHARD_BYTES >> 20)
    args = parser.parse_args(argv)
    root = Path(args.root)
    started = time.perf_counter()
    with console.status("generating the sample dataset (reused when present)…"):
        make_dataset(root / "sample", args.shards, args.shard_mib << 20)
    with console.status("starting a cluster: 1 metadata server, 4 data servers…"):
        cluster = ProcessCluster(root / "cluster", data_servers=4, fast=False)
        cluster.start()
    try:
        console.print(f"cluster up: metadata server {cluster.meta_url}")
        with console.status("writing the dataset in, then reading it back in parallel…"):
            result = asyncio.run(write_and_read(cluster.meta_url, root / "sample",
                                                "/datasets/sample"))
        report(result)
        step = 0.02
        with console.status("one shuffled epoch through stager.Loader…"):
            trained = train_epoch(cluster.meta_url, "/datasets/sample", step)
        report_training(trained, step)
    finally:
        with console.status("stopping the cluster…"):
            code = cluster.stop()
    console.print(f"cluster stopped (exit {code}); demo took "
                  f"{time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
