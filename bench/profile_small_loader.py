"""``python -m bench.profile_small`` modes of the Loader: epochs over the loader
benchmark's tar shards (alone, A/B across client processes, through
``StagerDataLoader``, as one DataLoader worker) and over one file per sample."""

from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from .common import machine_busy
from .profiling import measured, own_cpu, report

SMALL = 16 * 1024


@contextlib.contextmanager
def tar_cluster(root: Path, large: bool = False) -> Iterator[tuple[str, dict[str, int]]]:
    """The loader benchmark's tar shards, 8 of them, of 16 KiB samples (65,536) or
    with ``large`` of 1 MiB ones (1,536), on a metadata server and 3 data servers
    (processes): (meta URL, data server pids)."""
    from stager import Client
    from stager.testing.nodes import NodeCluster

    from .bench_loader import DATA_SERVERS, Size, make_data

    make_data(root / "www", Size("1 MiB", 1 << 20, 16, 1536, 8, 0, 0, 1) if large
              else Size("16 KiB", SMALL, 256, 65536, 8, 0, 0, 1))
    with NodeCluster(root / "cluster", DATA_SERVERS, mode="loopback") as cluster:
        with Client(cluster.meta_url) as c:
            c.put(root / "www" / "tar", "/tar", files_in_flight=8)
        yield cluster.meta_url, {f"data{i}": p.pid for i, p in enumerate(cluster.procs[1:])}


def loader_rounds(meta: str, pids: dict[str, int], index: Path, rounds: int,
                  shuffle: bool = True, batch: int = 256) -> list[tuple[float, float]]:
    """One epoch per round, as fast as it goes after the first batch: (samples/s,
    client CPU µs per sample) of each round, each printed."""
    import gc

    from stager import Loader

    out = []
    for r in range(rounds):
        built = [g["collections"] for g in gc.get_stats()]
        with Loader("/tar", meta_url=meta, batch_size=batch, seed=r, index_cache=index,
                    prefetch_bytes=256 << 20, prefetch_batches=16, shuffle=shuffle) as loader:
            it = iter(loader)
            next(it)
            before = [g["collections"] for g in gc.get_stats()]
            built = [b - a for a, b in zip(built, before, strict=True)]
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            n: list[int] = []
            wall, used = measured(pids, lambda it=it, n=n: n.append(sum(map(len, it))))
            made = [g["collections"] - b for g, b in zip(gc.get_stats(), before, strict=True)]
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        report(f"loader round {r}", n[0], "samples", wall, used, 1_000_000)
        print(f"  garbage collections by generation: {made} (until the first batch, "
              f"from making the Loader: {built}); page faults per sample: "
              f"{faults / n[0]:.2f}", flush=True)
        out.append((n[0] / wall, 1e6 * used["client"] / n[0]))
    return out


def loader_epochs(rounds: int, shuffle: bool = True) -> None:
    with tempfile.TemporaryDirectory(prefix="profile-loader-") as tmp, \
            tar_cluster(Path(tmp)) as (meta, pids):
        loader_rounds(meta, pids, Path(tmp) / "index", rounds, shuffle)


def loader_ab(setting: str, pairs: int, rounds: int, large: bool = False) -> None:
    """Client processes against one cluster, alternating between the values of one
    environment variable (``NAME=A,B``), A B then B A: each process's median
    samples/s and client CPU per sample."""
    name, _, values = setting.partition("=")
    choices = values.split(",")
    results: dict[str, list[tuple[float, float]]] = {v: [] for v in choices}
    with tempfile.TemporaryDirectory(prefix="profile-loader-ab-") as tmp, \
            tar_cluster(Path(tmp), large) as (meta, pids):
        for pair in range(pairs):
            for value in choices if pair % 2 == 0 else choices[::-1]:
                cmd = [sys.executable, "-m", "bench.profile_small", "loader-client",
                       "--meta", meta, "--index", str(Path(tmp) / "index"),
                       "--rounds", str(rounds), "--pids", json.dumps(pids),
                       "--batch", "16" if large else "256"]
                done = subprocess.run(cmd, env=dict(os.environ, **{name: value}), check=True,
                                      capture_output=True, text=True)
                rate, cpu = json.loads(done.stdout.splitlines()[-1])
                results[value].append((rate, cpu))
                print(f"{name}={value}: {rate:,.0f} samples/s, client {cpu:.2f} µs/sample",
                      flush=True)
    for value, got in results.items():
        print(f"{name}={value}: samples/s {' / '.join(f'{r:,.0f}' for r, _ in got)}; client "
              f"µs/sample {' / '.join(f'{c:.2f}' for _, c in got)}", flush=True)


def loader_client(meta: str, index: Path, rounds: int, pids: dict[str, int],
                  batch: int) -> None:
    got = loader_rounds(meta, pids, index, rounds, batch=batch)
    print(json.dumps([statistics.median(r for r, _ in got), statistics.median(c for _, c in got)]))


def torch_workers_ab(rounds: int) -> None:
    """``StagerDataLoader(num_workers=2)`` with its batches' bytes handed out as views
    of shared memory (``share_bytes=True``), copied out of it (``"copy"``) and
    pickled through the pipe (False), in turn in one process: samples/s, and the
    CPU per sample of this process and of the workers (after they exit)."""
    from stager.torch import StagerDataLoader, StagerDataset

    modes: list[bool | str] = [True, "copy", False]
    results: dict[bool | str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="profile-torch-ab-") as tmp, \
            tar_cluster(Path(tmp)) as (meta, _):
        with StagerDataset("/tar", meta_url=meta, batch_size=256, index_cache=Path(tmp) / "i",
                           prefetch_bytes=256 << 20, prefetch_batches=16) as ds:
            for r in range(rounds):
                for share in modes[r % 3:] + modes[:r % 3]:
                    ds.set_epoch(r)
                    dl = StagerDataLoader(ds, num_workers=2, multiprocessing_context="fork",
                                          share_bytes=share)
                    it = iter(dl)
                    next(it)
                    main, workers = own_cpu(), own_cpu(resource.RUSAGE_CHILDREN)
                    start = time.perf_counter()
                    n = sum(map(len, it))
                    wall = time.perf_counter() - start
                    del it                  # the workers exit: their CPU is counted
                    results[share].append((n / wall,
                                           1e6 * (own_cpu() - main) / n,
                                           1e6 * (own_cpu(resource.RUSAGE_CHILDREN) - workers) / n))
                    print(f"round {r} share_bytes={share}: {n / wall:,.0f} samples/s",
                          flush=True)
    for share, got in results.items():
        med = [statistics.median(x[i] for x in got) for i in range(3)]
        print(f"share_bytes={share}: median {med[0]:,.0f} samples/s; CPU µs/sample: main "
              f"{med[1]:.1f}, workers {med[2]:.1f}; each: "
              f"{' / '.join(f'{x[0]:,.0f}' for x in got)}", flush=True)


def worker_reads(rounds: int) -> None:
    """A Loader reading every step of an epoch, and a copy reading only the steps of
    DataLoader worker 0 of 2 (``for_worker``, in runs of steps as StagerDataLoader
    splits them), alternating in this process: what
    each costs the machine per sample, and what it asks the data servers for."""
    from stager import Loader
    from stager.loader.workers import run_length

    with tempfile.TemporaryDirectory(prefix="profile-worker-reads-") as tmp, \
            tar_cluster(Path(tmp)) as (meta, pids):
        for r in range(rounds):
            for worker in (None, 0) if r % 2 == 0 else (0, None):
                with Loader("/tar", meta_url=meta, batch_size=256, seed=r,
                            index_cache=Path(tmp) / "index", prefetch_bytes=256 << 20,
                            prefetch_batches=16) as whole:
                    run = run_length(whole.window, whole.batch_size, whole.world_size,
                                     whole.prefetch.batches)
                    loader = whole if worker is None else whole.for_worker(worker, 2, run)
                    it = iter(loader)
                    next(it)
                    busy = machine_busy()
                    got: list[int] = []
                    wall, used = measured(pids, lambda it=it, got=got: got.append(
                        sum(map(len, it))))
                    busy, n = machine_busy() - busy, got[0]
                    cpu = used.pop("client")
                    servers = sum(used.values())
                    stats = loader.stats()
                    requests = sum(t["requests"] for t in stats["targets"].values())
                    nbytes = sum(t["bytes"] for t in stats["targets"].values())
                    samples = stats["samples"]
                    loader.close()
                name = "every step      " if worker is None else "worker 0 of 2's"
                print(f"round {r} {name}: {n / wall:,.0f} samples/s; CPU µs/sample: machine "
                      f"{1e6 * busy / n:.1f}, client {1e6 * cpu / n:.1f}, data servers "
                      f"{1e6 * servers / n:.1f}; {requests} requests "
                      f"of {nbytes / requests / 1e6:.2f} MB, {nbytes / samples:,.0f} bytes "
                      "read per sample", flush=True)


def files_epochs(files: int, rounds: int) -> None:
    """The Loader's ``files`` format: ``files`` 16 KiB files, one stager file (one
    chunk) each, on 3 data servers (processes), an epoch per round in shuffled
    batches of 256: machine, client and data server CPU per sample."""
    from stager import Client, Loader
    from stager.testing.nodes import NodeCluster

    from .bench_loader import DATA_SERVERS

    with tempfile.TemporaryDirectory(prefix="profile-files-") as tmp:
        root = Path(tmp)
        rng = random.Random(0)
        (root / "files").mkdir()
        for i in range(files):
            (root / "files" / f"{i:07d}.bin").write_bytes(rng.randbytes(SMALL))
        with NodeCluster(root / "cluster", DATA_SERVERS, mode="loopback") as cluster:
            with Client(cluster.meta_url) as c:
                c.put(root / "files", "/files", files_in_flight=32)
            pids = {f"data{i}": p.pid for i, p in enumerate(cluster.procs[1:])}
            for r in range(rounds):
                with Loader("/files", meta_url=cluster.meta_url, batch_size=256, seed=r,
                            format="files", prefetch_bytes=256 << 20,
                            prefetch_batches=16) as loader:
                    it = iter(loader)
                    next(it)
                    busy = machine_busy()
                    n: list[int] = []
                    wall, used = measured(pids, lambda it=it, n=n: n.append(sum(map(len, it))))
                    busy = machine_busy() - busy
                    targets = loader.stats()["targets"].values()
                requests = sum(t["requests"] for t in targets)
                servers = sum(v for k, v in used.items() if k != "client")
                print(f"round {r}: {n[0] / wall:,.0f} samples/s; CPU µs/sample: machine "
                      f"{1e6 * busy / n[0]:.1f}, client {1e6 * used['client'] / n[0]:.1f}, "
                      f"data servers {1e6 * servers / n[0]:.1f}; {requests} requests, "
                      f"{sum(t['bytes'] for t in targets) / requests / 1e6:.2f} MB each",
                      flush=True)

