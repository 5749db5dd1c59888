"""Where small files and small samples spend their time: rates and CPU per process.

Two drivers, each printing its rate and the CPU seconds (user + system, from
``/proc``) every process spent, so a change can be compared with the code before
it on a shared machine, where CPU per file moves far less than the rate::

    python -m bench.profile_small stage --files 20000      # staging 16 KiB files
    python -m bench.profile_small stage --sources http,get,file,http   # side by side
    python -m bench.profile_small reads --samples 40000    # batched 16 KiB reads
    python -m bench.profile_small loader --rounds 5        # the Loader over tar shards
    python -m bench.profile_small loader-ab STAGER_EVENT_LOOP=asyncio,uvloop
    python -m bench.profile_small torch-ab --rounds 6      # StagerDataLoader share_bytes
    python -m bench.profile_small worker-reads             # an epoch vs worker 0 of 2's steps
    python -m bench.profile_small files --files 20000      # the Loader's files format
    python -m bench.profile_small chunks --rounds 4        # whole 4 MiB chunks, low mark on/off
    python -m bench.profile_small http-listing             # listing an HTTP source
    python -m bench.profile_small meta --files 2000        # create+commit rates
    python -m bench.profile_small group-commit             # the store thread's grouping

``stage``: a tree of 16 KiB files in 20 directories, served by the HTTP source
server (its own process) and read as ``file://``, staged into a metadata server
and 3 data servers (``stager up`` processes, fresh targets), one run per source.
``--sources`` names the runs, in order: ``http`` and ``file`` stage (each into
a fresh directory), ``get`` is fsspec ``get`` of the tree from the same HTTP
server to a local directory (the source's own read rate), ``rerun`` stages
from http again into the last ``http`` run's copy (every file unchanged).
``reads``: one packed file of 16 KiB samples on 4 data servers (processes),
read in shuffled batches of 256 with one ``POST /v1/read`` per target per batch,
4 batches in flight (as ``bench_small_samples``).
``worker-reads``: the same shards, an epoch read by one Loader against worker
0 of 2's steps of it (``Loader.for_worker``), alternating: machine CPU per
sample (``/proc/stat``), the client's and the data servers' CPU per sample,
requests and bytes read per sample.
``files``: the Loader's ``files`` format over 16 KiB files (one stager file and
one chunk each) on 3 data servers: machine, client and data server CPU per sample.
``chunks``: whole-chunk GETs (what the Loader reads a mostly covered chunk
with) of a 64 MiB file on one data server, 4 in flight, each round with the
raw client's ``SO_RCVLOWAT`` mark on and then off (``rawhttp.LOWAT_FROM``),
with the reads (``buffer_updated`` calls) per chunk.
``loader``: the ``Loader`` over the loader benchmark's 16 KiB tar shards (8
shards, 65,536 samples, 3 data servers), one epoch per round read as fast as
it goes (after the first batch; ``--no-shuffle``: in manifest order); also
prints the garbage collections the round made, per generation (and those until
its first batch, from making the Loader, which loads the shard index), and the
client's page faults per sample (``STAGER_LOADER_KEEP_FREED=0``: with malloc left alone).
``loader-ab NAME=A,B``: the same epochs in client processes against one
cluster, alternating between ``NAME=A`` and ``NAME=B`` (A B, B A, ...;
``--pairs``; ``--large``: 1 MiB samples), each process's median printed.
``torch-ab``: the same shards through ``StagerDataLoader(num_workers=2)``,
batches through shared memory and pickled, alternating in one process.

To measure the code before a change, run this file from a copy of that tree
(``git archive REV stager bench | tar -x -C /tmp/old``, copy this file into
``/tmp/old/bench``, then ``cd /tmp/old && PYTHONPATH=/tmp/old python -m
bench.profile_small ...``): the servers it starts import ``stager`` from there.
"""

from __future__ import annotations

import argparse
import asyncio
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
from collections.abc import Callable, Iterator
from pathlib import Path

import stager

from .common import cpu_seconds, machine_busy, new_client, run_async, upload_file

SMALL = 16 * 1024


def own_cpu(who: int = resource.RUSAGE_SELF) -> float:
    """CPU seconds of this process (or, ``RUSAGE_CHILDREN``, of its waited-for children)."""
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def measured(pids: dict[str, int], work: Callable[[], object]) -> tuple[float, dict[str, float]]:
    """Run ``work``; its wall seconds and the CPU seconds of each process (and this one)."""
    before = {k: cpu_seconds(p) for k, p in pids.items()}
    mine = own_cpu()
    start = time.perf_counter()
    work()
    wall = time.perf_counter() - start
    used = {k: cpu_seconds(p) - before[k] for k, p in pids.items()}
    used["client"] = own_cpu() - mine
    return wall, used


def report(name: str, count: int, unit: str, wall: float, used: dict[str, float],
           per: int) -> None:
    total = sum(used.values())
    split = ", ".join(f"{k} {per * v / count:.3f}" for k, v in used.items())
    print(f"{name}: {count / wall:,.0f} {unit}/s ({wall:.2f} s); CPU s per {per:,} {unit}: "
          f"{split}; total {per * total / count:.3f} ({total / wall:.2f} cores busy); "
          f"load {os.getloadavg()[0]:.1f}", flush=True)


def stage_small(files: int, sources: list[str]) -> None:
    from stager.testing.cluster import ProcessCluster
    from stager.testing.httpserver import HttpServer

    from .bench_stage import _drop, fsspec_get, stage

    with tempfile.TemporaryDirectory(prefix="profile-stage-") as tmp:
        root = Path(tmp)
        src = root / "src" / "small"
        block = os.urandom(SMALL)
        for i in range(files):
            d = src / f"d{i % 20:02d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"s{i:06d}.bin").write_bytes(block[i % 97:] + block[:i % 97])
        with HttpServer(root / "src") as http, ProcessCluster(root / "cluster", 3) as cluster:
            stage(cluster.meta_url, f"{http.url}/small/", "/warm", include=["d00/*"])
            asyncio.run(_drop(cluster.meta_url, "/warm"))
            pids = {"meta": int(cluster.info["meta"]["pid"]), "http source": http.proc.pid,
                    **{f"data{i}": cluster.data_pid(i) for i in range(3)}}
            last_http = ""
            for k, source in enumerate(sources):
                if source == "get":         # fsspec get from the same server, for comparison
                    wall, used = measured(pids, lambda: fsspec_get(f"{http.url}/small",
                                                                   root / "get"))
                    report("fsspec get http", files, "files", wall, used, 1000)
                    continue
                url = f"{http.url}/small/" if source != "file" else f"file://{src}"
                rerun = source == "rerun"       # again into the last http run's copy
                dst = last_http if rerun else f"/{source}-{k}"
                last_http = dst if source == "http" else last_http
                copied: list[int] = []

                def work(url: str = url, dst: str = dst, copied: list[int] = copied) -> None:
                    copied.append(stage(cluster.meta_url, url, dst)[1])

                wall, used = measured(pids, work)
                assert copied == [0 if rerun else files], copied
                report(f"stage {source}", files, "files", wall, used, 1000)


def http_listing(files: int) -> None:
    """How long listing an HTTP source with sizes takes: its directory pages carry no
    sizes, so ``Source.files`` costs a HEAD request per file (fsspec ``info``).
    Staging itself no longer lists this way: it sizes each file with the probe that
    also reads it (``stager.stage.feed``), measured by ``stage``."""
    from stager.stage.source import open_source
    from stager.testing.httpserver import HttpServer

    with tempfile.TemporaryDirectory(prefix="profile-listing-") as tmp:
        src = Path(tmp) / "small"
        block = os.urandom(SMALL)
        for i in range(files):
            d = src / f"d{i % 20:02d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"s{i:06d}.bin").write_bytes(block)
        with HttpServer(Path(tmp)) as http:
            async def listing() -> int:
                source = open_source(f"{http.url}/small/")
                try:
                    return len(await source.files())
                finally:
                    await source.close()

            for _ in range(2):
                start = time.perf_counter()
                n = asyncio.run(listing())
                seconds = time.perf_counter() - start
                print(f"listing {n:,} files over http: {seconds:.2f} s "
                      f"({n / seconds:,.0f} files/s); load {os.getloadavg()[0]:.1f}", flush=True)


def batched_reads(samples: int, rounds: int) -> None:
    from stager.testing.nodes import NodeCluster

    from .bench_small_samples import stager_batched

    order = list(range(samples))
    random.Random(1).shuffle(order)
    with tempfile.TemporaryDirectory(prefix="profile-reads-") as tmp:
        root = Path(tmp)
        rng = random.Random(0)
        with open(root / "packed.bin", "wb") as fh:
            for _ in range(samples):
                fh.write(rng.randbytes(SMALL))
        with open(root / "packed.bin", "rb") as fh:
            fh.seek(order[0] * SMALL)
            first = fh.read(SMALL)
        with NodeCluster(root / "cluster", 4, mode="loopback") as cluster:
            async def load() -> None:
                async with new_client(cluster.meta_url) as c:
                    await upload_file(c, root / "packed.bin", "/packed.bin")

            run_async(load())
            pids = {f"data{i}": p.pid for i, p in enumerate(cluster.procs[1:])}
            for r in range(rounds):
                wall, used = measured(pids, lambda: run_async(
                    stager_batched(cluster.meta_url, order, first)))
                report(f"reads round {r}", samples, "samples", wall, used, 1_000_000)


@contextlib.contextmanager
def tar_cluster(root: Path, large: bool = False) -> Iterator[tuple[str, dict[str, int]]]:
    """The loader benchmark's tar shards, 8 of them, of 16 KiB samples (65,536) or
    with ``large`` of 1 MiB ones (1,536), on a metadata server and 3 data servers
    (processes): (meta URL, data server pids)."""
    from stager import Client
    from stager.testing.nodes import NodeCluster

    from .bench_loader import DATA_SERVERS, Size, make_data

    make_data(root / "www", Size("1 MiB", 1 << 20, 16, 1536, 8, 0, 0) if large
              else Size("16 KiB", SMALL, 256, 65536, 8, 0, 0))
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
    """``StagerDataLoader(num_workers=2)`` with its batches through shared memory and
    pickled through the pipe, alternating in one process: samples/s, and the CPU
    per sample of this process and of the workers (after they exit)."""
    from stager.torch import StagerDataLoader, StagerDataset

    results: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="profile-torch-ab-") as tmp, \
            tar_cluster(Path(tmp)) as (meta, _):
        with StagerDataset("/tar", meta_url=meta, batch_size=256, index_cache=Path(tmp) / "i",
                           prefetch_bytes=256 << 20, prefetch_batches=16) as ds:
            for r in range(rounds):
                for share in (True, False) if r % 2 == 0 else (False, True):
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
    DataLoader worker 0 of 2 (``for_worker``), alternating in this process: what
    each costs the machine per sample, and what it asks the data servers for."""
    from stager import Loader

    with tempfile.TemporaryDirectory(prefix="profile-worker-reads-") as tmp, \
            tar_cluster(Path(tmp)) as (meta, pids):
        for r in range(rounds):
            for worker in (None, 0) if r % 2 == 0 else (0, None):
                with Loader("/tar", meta_url=meta, batch_size=256, seed=r,
                            index_cache=Path(tmp) / "index", prefetch_bytes=256 << 20,
                            prefetch_batches=16) as whole:
                    loader = whole if worker is None else whole.for_worker(worker, 2)
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


def whole_chunks(rounds: int) -> None:
    import numpy as np

    from stager import Client
    from stager.dataplane import rawhttp
    from stager.loader.fetch import Fetcher, FetchOptions
    from stager.testing.nodes import NodeCluster

    reads = [0]
    received = rawhttp._Conn.buffer_updated

    def counting(self: rawhttp._Conn, nbytes: int) -> None:
        reads[0] += 1
        received(self, nbytes)

    rawhttp._Conn.buffer_updated = counting     # type: ignore[method-assign]
    chunks, size = 16, 4 << 20
    with tempfile.TemporaryDirectory(prefix="profile-chunks-") as tmp:
        root = Path(tmp)
        (root / "f").write_bytes(os.urandom(chunks * size))
        with NodeCluster(root / "cluster", 1, mode="loopback") as cluster:
            with Client(cluster.meta_url) as c:
                c.put(root / "f", "/f")
            pids = {"data0": cluster.procs[1].pid}

            async def read_all(passes: int) -> None:
                async with new_client(cluster.meta_url) as c:
                    fetcher = Fetcher(c, [await c.stat("/f")], FetchOptions())
                    free: asyncio.Queue[bytearray] = asyncio.Queue()
                    for _ in range(4):
                        free.put_nowait(bytearray(size))
                    file = np.zeros(1, dtype=np.int64)

                    async def one(i: int) -> None:
                        # a whole chunk straight into a reused buffer, CRC-checked
                        plan = fetcher.table.plan(file, np.array([i * size]), np.array([size]),
                                                  alone=False)
                        buf = await free.get()
                        try:
                            await fetcher.engine.run(plan, [buf])
                        finally:
                            free.put_nowait(buf)
                    for _ in range(passes):
                        await asyncio.gather(*(one(i) for i in range(chunks)))

            run_async(read_all(1))      # warm: page cache, connections
            for r in range(rounds):
                for mark in (True, False):
                    rawhttp.LOWAT_FROM = 128 * 1024 if mark else 1 << 62
                    reads[0] = 0
                    wall, used = measured(pids, lambda: run_async(read_all(16)))
                    per = chunks * 16
                    report(f"chunks round {r}, low mark {'on ' if mark else 'off'}",
                           per * size >> 20, "MiB", wall, used, 1024)
                    print(f"  reads per chunk: {reads[0] / per:.1f}", flush=True)


def metadata_rates(files: int) -> None:
    """Empty files through the client against a metadata server process: one at a
    time, 16 in flight, and (where the client has it) write_many batches of 256."""
    from stager.testing.nodes import NodeCluster

    from .bench_metadata import _timed

    async def rates(url: str) -> None:
        async with new_client(url) as c:
            for name, parallel in (("1 at a time", 1), ("16 in flight", 16)):
                t = await _timed(lambda i, p=parallel: c.pipe(f"/p{p}/f{i:06d}", b""), files,
                                 parallel)
                print(f"create+commit, {name}: {files / t:,.0f} files/s", flush=True)
            if hasattr(c, "write_many"):
                start = time.perf_counter()
                for k in range(0, files, 256):
                    await c.write_many([(f"/b/f{i:06d}", b"")
                                        for i in range(k, min(files, k + 256))])
                print(f"create+commit, batches of 256: "
                      f"{files / (time.perf_counter() - start):,.0f} files/s", flush=True)

    with tempfile.TemporaryDirectory(prefix="profile-meta-") as tmp, \
            NodeCluster(Path(tmp) / "cluster", 4, mode="loopback") as cluster:
        run_async(rates(cluster.meta_url))
    print(f"load {os.getloadavg()[0]:.1f}")


def group_commit(files: int, writers: int = 16) -> None:
    """The metadata service alone (real SQLite, no HTTP): ``writers`` tasks each
    creating and committing files, with group commit off (groups of 1) and on."""
    from stager.config import load_config
    from stager.meta.service import MetaService
    from stager.meta.sqlite import SQLiteStore
    from stager.protocol.models import TargetInfo

    async def one(root: Path, max_group: int) -> None:
        service = MetaService(SQLiteStore(root / f"meta-{max_group}.sqlite3"),
                              load_config(env={}))
        service._store_thread.max_group = max_group
        for i in range(3):
            await service.register_target(TargetInfo(f"t{i}", f"n{i}", f"http://h{i}:1"))
        todo = iter(range(files))

        async def writer() -> None:
            for i in todo:
                upload, _ = await service.create(f"/d/f{i}")
                await service.commit(upload.file_id, size=0, checksums=())

        start = time.perf_counter()
        await asyncio.gather(*(writer() for _ in range(writers)))
        seconds = time.perf_counter() - start
        thread = service._store_thread
        print(f"group commit {'on ' if max_group > 1 else 'off'}: {files / seconds:,.0f} "
              f"files/s ({writers} writers; {thread.grouped_calls} of the {2 * files} store "
              f"writes shared {thread.groups} transactions)", flush=True)
        service.close()

    with tempfile.TemporaryDirectory(prefix="profile-group-") as tmp:
        for max_group in (1, 256, 1, 256):
            asyncio.run(one(Path(tmp), max_group))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_small", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("stage", help="stage 16 KiB files over http and file://")
    p.add_argument("--files", type=int, default=20_000)
    p.add_argument("--sources", default="http,file")
    p = sub.add_parser("reads", help="batched reads of 16 KiB samples")
    p.add_argument("--samples", type=int, default=40_000)
    p.add_argument("--rounds", type=int, default=3)
    p = sub.add_parser("loader", help="the Loader over 16 KiB tar shards")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-shuffle", action="store_true", help="read in manifest order")
    p = sub.add_parser("loader-ab", help="Loader client processes alternating between "
                       "two values of an environment variable")
    p.add_argument("setting", help="NAME=A,B, e.g. STAGER_EVENT_LOOP=asyncio,uvloop")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=4, help="epochs per process")
    p.add_argument("--large", action="store_true", help="1 MiB samples, batches of 16")
    p = sub.add_parser("loader-client", help=argparse.SUPPRESS)
    p.add_argument("--meta", required=True)
    p.add_argument("--index", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--pids", type=json.loads, default={})
    p.add_argument("--batch", type=int, default=256)
    p = sub.add_parser("torch-ab", help="StagerDataLoader(2 workers), shared memory or pickled")
    p.add_argument("--rounds", type=int, default=6)
    p = sub.add_parser("worker-reads", help="a Loader's epoch against DataLoader worker "
                       "0 of 2's steps of it")
    p.add_argument("--rounds", type=int, default=4)
    p = sub.add_parser("files", help="the Loader's files format: one 16 KiB file a sample")
    p.add_argument("--files", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=4)
    p = sub.add_parser("chunks", help="whole 4 MiB chunk GETs, SO_RCVLOWAT on and off")
    p.add_argument("--rounds", type=int, default=3)
    p = sub.add_parser("http-listing", help="list an HTTP source of 16 KiB files")
    p.add_argument("--files", type=int, default=20_000)
    p = sub.add_parser("meta", help="create+commit rates through a metadata server")
    p.add_argument("--files", type=int, default=2000)
    p = sub.add_parser("group-commit", help="the metadata service with group commit off/on")
    p.add_argument("--files", type=int, default=3000)
    args = parser.parse_args()
    print(f"stager from {Path(stager.__file__).parent}", flush=True)
    if args.what == "stage":
        stage_small(args.files, args.sources.split(","))
    elif args.what == "reads":
        batched_reads(args.samples, args.rounds)
    elif args.what == "loader":
        loader_epochs(args.rounds, shuffle=not args.no_shuffle)
    elif args.what == "loader-ab":
        loader_ab(args.setting, args.pairs, args.rounds, args.large)
    elif args.what == "loader-client":
        loader_client(args.meta, args.index, args.rounds, args.pids, args.batch)
    elif args.what == "torch-ab":
        torch_workers_ab(args.rounds)
    elif args.what == "worker-reads":
        worker_reads(args.rounds)
    elif args.what == "files":
        files_epochs(args.files, args.rounds)
    elif args.what == "chunks":
        whole_chunks(args.rounds)
    elif args.what == "http-listing":
        http_listing(args.files)
    elif args.what == "meta":
        metadata_rates(args.files)
    else:
        group_commit(args.files)


if __name__ == "__main__":
    main()
