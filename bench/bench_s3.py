"""The S3 gateway beside stager's own clients, on one ``stager up --s3-port`` cluster.

Issue 29's benchmarks, side by side in one run: one cluster of four data servers as
processes with its gateway (``stager.testing.S3Cluster``), moto's S3 server in this
process for the small objects' reference.  Every round measures every case in turn,
the order reversed every other round; each ratio is taken within its round, and an
aim is met only when the lower quartile of those rounds reaches it.

- **GET of one big object** (1 GiB; quick: 32 MiB, default layout: 4 MiB chunks
  striped over the four servers), every byte landing in one preallocated buffer:
  boto3 ``get_object`` with its body read in 8 MiB pieces (one GET, one
  connection); boto3 ``download_fileobj`` with its default transfer config (8 MiB
  ranged GETs, 10 threads); s3fs ``open`` and ``read`` in 8 MiB pieces; the same file
  through ``stager://`` (fsspec ``open`` and ``read`` in 8 MiB pieces, the
  denominator of the GET aims) and ``AsyncClient.read_into``.
- **PUT of the same local file**: boto3 ``upload_fileobj`` with its default transfer
  config (multipart, 8 MiB parts, 10 threads) against ``Client.put``.
- **16 KiB objects**: boto3 ``get_object`` of every object, one client, a thread
  pool of 16 (as s3transfer's), against stager's gateway and against moto's server
  holding the same objects; and stager's batched read of the same files through its
  fsspec filesystem (``cat_ranges`` of every path: the stats in parallel, then one
  read plan, one batched request per data server; the client has no other batch read).
- **memory**: the gateway process's peak RSS during each S3 GET and PUT (its
  ``VmHWM`` from ``/proc``, reset before each case through ``clear_refs``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Any

from stager.checksum import crc32c
from stager.client.sync import Client
from stager.config import load_config
from stager.testing.s3clients import S3Endpoint, moto_endpoint
from stager.testing.s3cluster import S3Cluster

from . import s3_null
from .common import (
    GiB,
    KiB,
    MiB,
    aim,
    median,
    new_client,
    paired,
    quartiles,
    r2,
    rate,
    run_async,
    scratch,
    write_local,
)
from .s3_watch import BufferFile, Cpu, Gateway, MetaRequests

DATA_SERVERS = 4
BUCKET = "bench"
BIG_KEY = "big.bin"
SMALL = 16 * KiB
PIECE = 8 * MiB
THREADS = 16
CAT_BATCH = 1000            # paths to one cat_ranges call
GET_AIM = 0.8
PUT_AIM = 0.8
# case name -> (unit, kind); the order they run in (reversed every other round)
GETS = ("boto3 get_object", "boto3 download_fileobj", "s3fs open/read",
        "stager:// open/read", "AsyncClient.read_into")
PUTS = ("boto3 upload_fileobj", "Client.put")
# each S3 client against a server that costs nothing (bench.s3_null): its ceiling here
CEILINGS = {"boto3 get_object": "boto3 get_object -> null",
            "boto3 download_fileobj": "boto3 download_fileobj -> null",
            "s3fs open/read": "s3fs open/read -> null",
            "boto3 upload_fileobj": "boto3 upload_fileobj -> null"}
CASE_METHODS = {"boto3 get_object": "boto3_get", "boto3 download_fileobj": "boto3_download",
                "s3fs open/read": "s3fs_read", "boto3 upload_fileobj": "boto3_upload"}
SMALLS = ("boto3 -> stager S3", "boto3 -> moto", "stager:// cat_ranges")
WATCHED = ("boto3 get_object", "boto3 download_fileobj", "s3fs open/read",
           "boto3 upload_fileobj")
MOSAIC = ("Mosaic Streaming with its S3 remote (issue 29's last benchmark) is not measured: "
          "mosaicml-streaming imports torchvision at `import streaming`, and the registry's "
          "torchvision for the CPU torch here fails to import (`operator torchvision::nms "
          "does not exist`); only a CUDA torch build (several GB) imports it "
          "(/work/shared/notes/s3-clients.md).")


class Bench:
    """The cluster, moto, the data on both and one function per case."""

    def __init__(self, tmp: Path, s3: S3Cluster, moto: S3Endpoint, big: int,
                 objects: int) -> None:
        self.tmp, self.s3, self.moto = tmp, s3, moto
        self.big, self.objects = big, objects
        self.stager = S3Endpoint(s3.url, s3.access_key, s3.secret_key)
        self.null: S3Endpoint | None = None      # bench.s3_null, once the local file is
        self.local = tmp / "big.bin"
        self.buf = memoryview(bytearray(big))
        self.keys = [f"small/{i:06d}.bin" for i in range(objects)]
        self.gateway = Gateway(int(s3.cluster.info["s3"]["pid"]))
        self.meta = MetaRequests(s3.meta_url)
        self.cpu = Cpu(self.gateway.pid, [s3.cluster.meta_pid()]
                       + [s3.cluster.data_pid(i) for i in range(DATA_SERVERS)])

    def settle(self) -> None:
        """The big local file, the bucket, the big object (written through stager), the
        small objects on stager (one ``write_many`` per batch) and on moto."""
        write_local(self.local, self.big, seed=29)
        api = self.stager.boto3()
        api.create_bucket(Bucket=BUCKET)
        api.close()
        rng = random.Random(29)
        smalls = [rng.randbytes(SMALL) for _ in self.keys]

        async def load() -> None:
            async with new_client(self.s3.meta_url) as c:
                await c.put(self.local, f"/{BUCKET}/{BIG_KEY}")
                items = [(f"/{BUCKET}/{k}", d) for k, d in zip(self.keys, smalls, strict=True)]
                for i in range(0, len(items), 500):
                    await c.write_many(items[i:i + 500])

        run_async(load())
        moto = self.moto.boto3(max_pool_connections=THREADS)
        moto.create_bucket(Bucket=BUCKET)
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(lambda kd: moto.put_object(Bucket=BUCKET, Key=kd[0], Body=kd[1]),
                          zip(self.keys, smalls, strict=True)))
        moto.close()
        self.expected = self.local.read_bytes()[:4096]

    def check(self, n: int) -> None:
        if n != self.big or self.buf[:4096] != self.expected:
            raise AssertionError(f"read {n} of {self.big} bytes, or the wrong ones")
        self.buf[:4096] = bytes(4096)

    # -- big GETs: MB/s --------------------------------------------------------------
    def boto3_get(self, endpoint: S3Endpoint | None = None) -> float:
        api = (endpoint or self.stager).boto3()
        start = time.perf_counter()
        body = api.get_object(Bucket=BUCKET, Key=BIG_KEY)["Body"]
        n = 0
        while piece := body.read(PIECE):
            self.buf[n:n + len(piece)] = piece
            n += len(piece)
        seconds = time.perf_counter() - start
        api.close()
        self.check(n)
        return rate(n, seconds)

    def boto3_download(self, endpoint: S3Endpoint | None = None) -> float:
        api = (endpoint or self.stager).boto3()
        target = BufferFile(self.buf)
        start = time.perf_counter()
        api.download_fileobj(BUCKET, BIG_KEY, target)
        seconds = time.perf_counter() - start
        api.close()
        self.check(target.written)
        return rate(self.big, seconds)

    def s3fs_read(self, endpoint: S3Endpoint | None = None) -> float:
        fs = (endpoint or self.stager).s3fs()
        fs.connect()            # aiobotocore's session and client, made once, not timed
        return self._fsspec_read(fs, f"{BUCKET}/{BIG_KEY}")

    def stager_read(self) -> float:
        import fsspec

        fs = fsspec.filesystem("stager", meta_url=self.s3.meta_url, skip_instance_cache=True)
        try:
            return self._fsspec_read(fs, f"/{BUCKET}/{BIG_KEY}")
        finally:
            fs.close()

    def _fsspec_read(self, fs: Any, path: str) -> float:
        start = time.perf_counter()
        n = 0
        with fs.open(path, "rb", block_size=PIECE) as f:
            while piece := f.read(PIECE):
                self.buf[n:n + len(piece)] = piece
                n += len(piece)
        seconds = time.perf_counter() - start
        self.check(n)
        return rate(n, seconds)

    def read_into(self) -> float:
        async def go() -> tuple[float, int]:
            async with new_client(self.s3.meta_url) as c:
                start = time.perf_counter()
                n = await c.read_into(f"/{BUCKET}/{BIG_KEY}", self.buf)
                return time.perf_counter() - start, n

        seconds, n = run_async(go())
        self.check(n)
        return rate(n, seconds)

    # -- big PUTs: MB/s --------------------------------------------------------------
    def boto3_upload(self, endpoint: S3Endpoint | None = None) -> float:
        api = (endpoint or self.stager).boto3()
        start = time.perf_counter()
        with open(self.local, "rb") as f:
            api.upload_fileobj(f, BUCKET, "put-boto3.bin")
        seconds = time.perf_counter() - start
        size = api.head_object(Bucket=BUCKET, Key="put-boto3.bin")["ContentLength"]
        api.close()
        if size != self.big:
            raise AssertionError(f"uploaded {size} of {self.big} bytes")
        return rate(self.big, seconds)

    def client_put(self) -> float:
        with Client(self.s3.meta_url, config=load_config({}, env={})) as c:
            start = time.perf_counter()
            c.put(self.local, f"/{BUCKET}/put-client.bin")
            seconds = time.perf_counter() - start
            size = c.stat(f"/{BUCKET}/put-client.bin", cached=False).size
        if size != self.big:
            raise AssertionError(f"put {size} of {self.big} bytes")
        return rate(self.big, seconds)

    # -- 16 KiB objects: objects/s ---------------------------------------------------
    def small_boto3(self, endpoint: S3Endpoint, order: list[str]) -> float:
        api = endpoint.boto3(max_pool_connections=THREADS)

        def get(key: str) -> int:
            return len(api.get_object(Bucket=BUCKET, Key=key)["Body"].read())

        with ThreadPoolExecutor(THREADS) as pool:
            start = time.perf_counter()
            got = sum(pool.map(get, order))
            seconds = time.perf_counter() - start
        api.close()
        if got != SMALL * len(order):
            raise AssertionError(f"{got} bytes of {SMALL * len(order)}")
        return len(order) / seconds

    def small_stager(self, order: list[str]) -> float:
        import fsspec

        fs = fsspec.filesystem("stager", meta_url=self.s3.meta_url, skip_instance_cache=True)
        paths = [f"/{BUCKET}/{k}" for k in order]
        try:
            start = time.perf_counter()
            got = 0
            for i in range(0, len(paths), CAT_BATCH):
                part = paths[i:i + CAT_BATCH]
                got += sum(len(b) for b in fs.cat_ranges(part, [0] * len(part),
                                                         [None] * len(part), on_error="raise"))
            seconds = time.perf_counter() - start
        finally:
            fs.close()
        if got != SMALL * len(paths):
            raise AssertionError(f"{got} bytes of {SMALL * len(paths)}")
        return len(paths) / seconds

    def cases(self, order: list[str]) -> dict[str, Callable[[], float]]:
        return {
            "boto3 get_object": self.boto3_get,
            "boto3 download_fileobj": self.boto3_download,
            "s3fs open/read": self.s3fs_read,
            "stager:// open/read": self.stager_read,
            "AsyncClient.read_into": self.read_into,
            "boto3 upload_fileobj": self.boto3_upload,
            "Client.put": self.client_put,
            "boto3 -> stager S3": lambda: self.small_boto3(self.stager, order),
            "boto3 -> moto": lambda: self.small_boto3(self.moto, order),
            "stager:// cat_ranges": lambda: self.small_stager(order),
        } | {null: self._on_null(CASE_METHODS[case]) for case, null in CEILINGS.items()}

    def _on_null(self, method: str) -> Callable[[], float]:
        return lambda: getattr(self, method)(self.null)


def hash_floor(data: bytes | memoryview, piece: int = 4 * MiB) -> dict[str, float]:
    """CPU seconds per GiB of each hash a boto3 PUT over http obliges the gateway to
    make, in ``piece``-sized updates as it makes them: the MD5 of the ETag, the SHA-256
    of ``x-amz-content-sha256`` (botocore signs the payload where the endpoint is not
    https), the CRC32 of boto3's default checksum; and stager's CRC32C of each chunk."""
    def crc(fn: Callable[[Any, int], int]) -> Callable[[memoryview], None]:
        value = 0

        def update(b: memoryview) -> None:
            nonlocal value
            value = fn(b, value)
        return update

    view = memoryview(data)
    out: dict[str, float] = {}
    for name, update in (("MD5", hashlib.md5(usedforsecurity=False).update),
                         ("SHA-256", hashlib.sha256().update),
                         ("CRC32", crc(zlib.crc32)), ("CRC32C", crc(crc32c))):
        start = time.process_time()
        for at in range(0, len(view), piece):
            update(view[at:at + piece])
        out[name] = (time.process_time() - start) / (len(view) / GiB)
    return out


def _put_floor(cpu: Cpu, floor: dict[str, float], big: int) -> str:
    """The PUT aim against what no gateway can spare: the hashes S3 asks of it."""
    gib = big / GiB

    def med(case: str, i: int) -> float:
        return median([c[i] for c in cpu.spent[case]]) / gib

    hashes = floor["MD5"] + floor["SHA-256"] + floor["CRC32"]
    base = cpu.total("Client.put") / gib
    least = med("boto3 upload_fileobj", 2) + hashes + med("Client.put", 1)
    return ("the PUT's floor: the hashes a boto3 PUT over http asks of any gateway, "
            "measured here over the big file: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                           floor.items())
            + f" CPU s per GiB (MD5 + SHA-256 + CRC32: {hashes:.2f}); with boto3's own "
            f"{med('boto3 upload_fileobj', 2):.2f} and the servers' {med('Client.put', 1):.2f} "
            f"(Client.put's), the S3 PUT costs at least {least:.2f} CPU s per GiB against "
            f"Client.put's {base:.2f} in all: bound by CPU alone (every core busy), "
            f"boto3 upload_fileobj / Client.put is at most {base / least:.2f} whatever "
            "the gateway does besides hashing")


def run(quick: bool) -> dict[str, Any]:
    big = 32 * MiB if quick else 1024 * MiB
    objects = 128 if quick else 4000
    rounds = 1 if quick else 3
    figures: dict[str, list[float]] = {}
    loads: list[float] = []
    logging.getLogger("werkzeug").setLevel(logging.WARNING)    # moto's access log
    with scratch("s3") as tmp, moto_endpoint() as moto, ExitStack() as stack, \
            S3Cluster(tmp / "cluster", data_servers=DATA_SERVERS) as s3:
        bench = Bench(tmp, s3, moto, big, objects)
        bench.settle()
        floor = hash_floor(bench.local.read_bytes())
        bench.null = stack.enter_context(s3_null.running(bench.local))
        idle_rss = bench.gateway.rss()
        for r in range(rounds):
            order = random.Random(r).sample(bench.keys, len(bench.keys))
            cases = list(bench.cases(order).items())
            for name, case in (cases if r % 2 == 0 else cases[::-1]):
                with bench.meta.watch(name), bench.cpu.watch(name), \
                        bench.gateway.watch(name) if name in WATCHED else nullcontext():
                    figure = case()
                figures.setdefault(name, []).append(figure)
            loads.append(os.getloadavg()[0])
        peaks = bench.gateway.peaks
        cpu = [bench.cpu.line(n, big / GiB, "GiB") for n in GETS + PUTS + (*CEILINGS.values(),)]
        cpu += [bench.cpu.line(n, objects / 1000, "1000 objects") for n in SMALLS]
        bound = [bench.cpu.bound(n, "stager:// open/read") for n in GETS[:3]]
        bound.append(bench.cpu.bound("boto3 upload_fileobj", "Client.put"))
        cpu.append("the ratio each S3 case would reach if CPU alone bound it (the stager "
                   "case's CPU over the S3 case's, all processes): " + "; ".join(bound))
        cpu.append(_put_floor(bench.cpu, floor, big))
        meta = [bench.meta.line(n, 1, "case") for n in GETS + PUTS]
        meta += [bench.meta.line(n, objects, "object") for n in SMALLS]
        cpu.append("metadata server requests (op status: count) per case, first round "
                   "(a GET through S3 of a file not written through S3 also looks for its "
                   "attribute record: stat 404): " + "; ".join(meta))
    return _result(figures, peaks, idle_rss, loads, cpu, big, objects, rounds, quick)


def judged(ratios: list[float], target: float) -> dict[str, Any]:
    """``ratio >= target`` met only when the lower quartile of the rounds reaches it."""
    low, high = quartiles(ratios)
    return aim(median(ratios), f">= {target} (lower quartile {r2(low)}, spread "
               f"{r2(low)}-{r2(high)} over {len(ratios)} round(s))", low >= target)


def _rounds(values: list[float]) -> str:
    return " / ".join(f"{v:.3f}" if v < 10 else f"{v:.0f}" for v in values)


def _result(figures: dict[str, list[float]], peaks: dict[str, list[int]], idle_rss: int,
            loads: list[float], cpu: list[str], big: int, objects: int, rounds: int,
            quick: bool) -> dict[str, Any]:
    def row(name: str, kind: str, unit: str, over: str | None) -> list[Any]:
        each = paired(figures[name], figures[over or name])
        peak = max(peaks[name]) / MiB if name in peaks else None
        return [name, kind, r2(median(figures[name])), unit, over or "(itself)",
                r2(median(each)), r2(peak) if peak is not None else None]

    get_base, put_base, small_base = "stager:// open/read", "Client.put", "boto3 -> moto"
    rows = [row(n, f"GET {big // MiB} MiB", "MB/s", None if n == get_base else get_base)
            for n in GETS]
    rows += [row(n, f"PUT {big // MiB} MiB", "MB/s", None if n == put_base else put_base)
             for n in PUTS]
    rows += [row(n, f"GET {objects} x 16 KiB", "objects/s",
                 None if n == small_base else small_base) for n in SMALLS]
    rows += [row(null, f"{'PUT' if case in PUTS else 'GET'} {big // MiB} MiB", "MB/s",
                 put_base if case in PUTS else get_base) for case, null in CEILINGS.items()]
    ratios: dict[str, float] = {}
    aims: dict[str, Any] = {}
    spreads: list[str] = []
    for case, base, target in [*((g, get_base, GET_AIM) for g in GETS[:3]),
                               ("boto3 upload_fileobj", put_base, PUT_AIM),
                               ("AsyncClient.read_into", get_base, None),
                               ("boto3 -> stager S3", small_base, None),
                               ("stager:// cat_ranges", small_base, None),
                               ("boto3 -> stager S3", "stager:// cat_ranges", None),
                               *((null, put_base if case in PUTS else get_base, None)
                                 for case, null in CEILINGS.items())]:
        each = paired(figures[case], figures[base])
        label = f"{case} / {base}"
        ratios[label] = r2(median(each))
        spreads.append(f"{label}, every round: {_rounds(each)}")
        if target is not None:
            aims[label] = judged(each, target)
    every = [f"{name}, every round: {_rounds(v)}" for name, v in figures.items()]
    memory = (f"gateway RSS idle {idle_rss / MiB:.0f} MiB before the first round; peak (VmHWM, "
              "reset before each case) during each S3 case, every round: "
              + "; ".join(f"{n} {' / '.join(f'{p / MiB:.0f}' for p in v)} MiB"
                          for n, v in peaks.items()))
    return {
        "title": "S3 gateway against stager's own clients (boto3, s3fs, moto)",
        "command": "python -m bench s3" + (" --quick" if quick else ""),
        "columns": ["case", "operation", "rate", "unit", "against", "x against (median)",
                    "gateway peak RSS MiB"],
        "rows": rows,
        "ratios": ratios,
        "aims": aims,
        "notes": [
            f"One `stager up --s3-port 0` cluster ({DATA_SERVERS} data servers as processes, "
            "one gateway process, loopback) and moto's S3 server (ThreadedMotoServer, in the "
            f"benchmark's process); {rounds} round(s), every case measured in each round, the "
            "order reversed every other round. Ratios are the medians of each round's own "
            "ratio; an aim is met only when the lower quartile of the rounds reaches it.",
            f"GET: one {big // MiB} MiB object (default layout, written with Client.put), "
            "every byte copied into one preallocated buffer. boto3 get_object: one GET, the "
            f"body read {PIECE // MiB} MiB at a time; boto3 download_fileobj: its default "
            "TransferConfig (8 MiB ranged GETs, 10 threads) into a seekable file over the "
            f"buffer; s3fs and stager://: fsspec open(block_size={PIECE // MiB} MiB) and "
            f"read({PIECE // MiB} MiB); AsyncClient.read_into: the whole file at once. "
            "A fresh client (and fsspec filesystem) per case, not timed.",
            f"PUT: the same local file ({big // MiB} MiB, in the page cache): boto3 "
            "upload_fileobj with its default TransferConfig (multipart above 8 MiB, 8 MiB "
            "parts, 10 threads, boto3's default CRC32 checksums) against Client.put; each "
            "overwrites its own key every round.",
            f"16 KiB objects: {objects} objects, read in a shuffled order each round. boto3: "
            f"one client (max_pool_connections={THREADS}), get_object + read of each in a "
            f"thread pool of {THREADS}, against stager's gateway and against moto's server "
            "holding the same objects. stager:// cat_ranges: fsspec's batched read of whole "
            f"files, {CAT_BATCH} paths a call (a stat each, in parallel, then one read plan, "
            "one batched POST /v1/read per data server); the Client has no batch read of "
            "whole files of its own.",
            "Ceilings: each S3 client against bench.s3_null, a server of its own process "
            "that serves the same bytes from memory and discards what is put (no "
            "signature check, no hash, no storage): the ratio that client could reach "
            "here were the gateway free; the rows '... -> null' and the ratios with "
            "'-> null' stand next to the gateway's.",
            memory,
            "CPU per case (medians over the rounds, from /proc; this process holds the "
            "clients and moto's server): " + "; ".join(cpu) + ".",
            f"load average (1 min) after each round: {_rounds(loads)} on a shared machine "
            f"of {os.cpu_count()} cores; absolute rates move with it, the in-round ratios less.",
            *spreads,
            *every,
            MOSAIC,
        ],
        "plot": {"kind": "barh", "x": "case", "y": ["x against (median)"],
                 "ylabel": "rate relative to the case it is judged against"},
    }
