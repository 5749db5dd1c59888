"""``python -m bench.profile_small`` modes of the data path: staging small files,
listing an HTTP source, batched 16 KiB reads, whole-chunk GETs (see that module's
docstring for what each measures)."""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time
from pathlib import Path

from .common import new_client, run_async, upload_file
from .profiling import measured, report

SMALL = 16 * 1024


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
    from stager.sources.open import open_source
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

