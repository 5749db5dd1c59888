"""Metadata: creates, stats and listings per second; listing one huge directory.

Through the client against a metadata server process (SQLite, fsync on every
commit) with four data servers registered.  Side by side, the same operations
on the local file system (create + fsync, ``os.stat``, ``os.scandir``).
The huge directory is filled through the metadata store's own interface before
the server starts (through HTTP it would take minutes of creates, measured
above); only the listing is timed, through the client, page by page.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

from stager.meta.store.base import MetaStore, Upload
from stager.meta.store.sqlite.store import SQLiteStore
from stager.protocol.manifest import Manifest, ManifestFile
from stager.protocol.models import Layout
from stager.testing.nodes import NodeCluster

from .bench_metadata_pg import store_aims, store_rows
from .common import many_timed, new_client, r2, run_async, scratch

PARALLEL = 16
BATCH = 256
SMALL_DIR = 100


def fill_store(db: Path, directory: str, n: int) -> float:
    """``n`` empty committed files in ``directory`` of a new store; returns seconds."""
    return run_async(_fill_store(db, directory, n))


async def _fill_store(db: Path, directory: str, n: int) -> float:
    store = SQLiteStore(db)
    start = time.perf_counter()
    try:
        await fill(store, directory, n)
    finally:
        store.close()
    return time.perf_counter() - start


async def fill(store: MetaStore, directory: str, n: int) -> list[Upload]:
    """``n`` empty files committed in ``directory`` of ``store`` through its batch
    methods (a transaction per 1,000); their uploads, in order."""
    layout = Layout(chunk_size=4 << 20, stripe_count=1, replicas=1, targets=("t-bench",),
                    nodes=("node0",))
    await store.mkdir(directory, parents=True, exist_ok=True, now=time.time())
    done: list[Upload] = []
    for k in range(0, n, 1000):
        now = time.time()
        uploads = [Upload(uuid.uuid4().hex, f"{directory}/f{i:07d}", layout, True, True,
                          now) for i in range(k, min(n, k + 1000))]
        await store.begin_uploads(uploads)
        await store.commit_uploads([(u.file_id, 0, (), now) for u in uploads], now=now)
        done.extend(uploads)
    return done


async def stager_ops(meta_url: str, creates: int, stats: int, lists: int,
                     huge: str) -> dict[str, tuple[float, str]]:
    """Rates of each operation: {name: (per second, detail)}."""
    out: dict[str, tuple[float, str]] = {}
    async with new_client(meta_url) as c:
        await c.mkdir("/seq")
        await c.mkdir("/par")
        t = await many_timed(lambda i: c.pipe(f"/seq/f{i:06d}", b""), creates, 1)
        out["create (0 B), 1 at a time"] = (creates / t, f"{creates} files")
        t = await many_timed(lambda i: c.pipe(f"/par/f{i:06d}", b""), creates, PARALLEL)
        out[f"create (0 B), {PARALLEL} in flight"] = (creates / t, f"{creates} files")
        t = await _batched_creates(c, creates)
        out[f"create+commit (0 B), batches of {BATCH} (write_many)"] = (creates / t,
                                                                       f"{creates} files")
        t = await many_timed(lambda i: c.stat(f"/seq/f{i % creates:06d}", cached=False), stats, 1)
        out["stat, 1 at a time"] = (stats / t, f"{stats} stats")
        t = await many_timed(lambda i: c.stat(f"/par/f{i % creates:06d}", cached=False), stats,
                         PARALLEL)
        out[f"stat, {PARALLEL} in flight"] = (stats / t, f"{stats} stats")
        small = f"/seq-small-{uuid.uuid4().hex[:6]}"
        await asyncio.gather(*(c.pipe(f"{small}/f{i:03d}", b"") for i in range(SMALL_DIR)))
        t = await many_timed(lambda i: c.ls(small), lists, 1)
        out[f"list a {SMALL_DIR}-entry directory"] = (lists / t, f"{lists} listings")
        start = time.perf_counter()
        n = len(await c.ls(huge))
        t = time.perf_counter() - start
        out[f"list a {n:,}-entry directory: entries/s"] = (n / t, f"{t:.2f} s")
    return out


async def _batched_creates(c: Any, count: int) -> float:
    """Seconds for ``count`` empty files written ``BATCH`` at a time with write_many
    (one create and one commit request of that many files, two transactions, per
    batch)."""
    start = time.perf_counter()
    for k in range(0, count, BATCH):
        results = await c.write_many([(f"/bat/f{i:06d}", b"")
                                      for i in range(k, min(count, k + BATCH))])
        if any(isinstance(r, Exception) for r in results):
            raise AssertionError(f"batched create failed: {results}")
    return time.perf_counter() - start


def loader_first_batch(meta_url: str, path: str) -> float:
    """Seconds from constructing a Loader over ``path`` to holding its first batch."""
    from stager.loader import Loader

    start = time.perf_counter()
    with Loader(path, batch_size=256, format="files", meta_url=meta_url) as loader:
        next(iter(loader))
    return time.perf_counter() - start


async def record_manifest(meta_url: str, path: str) -> int:
    """Record the manifest staging would have recorded for ``path``; returns its files."""
    async with new_client(meta_url) as c:
        files = tuple([ManifestFile(e.path.rsplit("/", 1)[1], e.size, e.mtime, e.file_id or "")
                       async for e in c.iter_dir(path)])
        return await c.put_manifest(Manifest(path, files, source="bench", created=time.time()))


def loader_ops(meta_url: str, huge: str) -> dict[str, tuple[float, str]]:
    """A loader's time to first batch on the huge dataset: by listing, then by manifest."""
    out: dict[str, tuple[float, str]] = {}
    t = loader_first_batch(meta_url, huge)
    out["loader time to first batch, by listing: 1/s"] = (1 / t, f"{t:.2f} s")
    n = run_async(record_manifest(meta_url, huge))
    t = loader_first_batch(meta_url, huge)
    out["loader time to first batch, from the manifest: 1/s"] = (1 / t, f"{t:.2f} s, {n:,} files")
    return out


def local_ops(root: Path, creates: int, stats: int, lists: int,
              huge: int) -> dict[str, tuple[float, str]]:
    """The same operations on the local file system (durable creates: fsync file + dir)."""
    out: dict[str, tuple[float, str]] = {}
    d = root / "local"
    d.mkdir()
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    start = time.perf_counter()
    for i in range(creates):
        fd = os.open(d / f"f{i:06d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.fsync(fd)
        os.close(fd)
        os.fsync(dfd)
    os.close(dfd)
    out["create (0 B), 1 at a time"] = (creates / (time.perf_counter() - start),
                                               "open(O_CREAT)+fsync file+dir")
    start = time.perf_counter()
    for i in range(stats):
        os.stat(d / f"f{i % creates:06d}")
    out["stat, 1 at a time"] = (stats / (time.perf_counter() - start), "os.stat")
    small = root / "small"
    small.mkdir()
    for i in range(SMALL_DIR):
        (small / f"f{i:03d}").touch()
    start = time.perf_counter()
    for _ in range(lists):
        with os.scandir(small) as it:
            [(e.name, e.stat()) for e in it]
    out[f"list a {SMALL_DIR}-entry directory"] = (lists / (time.perf_counter() - start),
                                                  "os.scandir + stat")
    big = root / "big"
    big.mkdir()
    for i in range(huge):
        (big / f"f{i:07d}").touch()
    start = time.perf_counter()
    with os.scandir(big) as it:
        n = len([(e.name, e.stat()) for e in it])
    t = time.perf_counter() - start
    out[f"list a {n:,}-entry directory: entries/s"] = (n / t, f"{t:.2f} s")
    return out


def run(quick: bool) -> dict[str, Any]:
    creates, stats, lists = (100, 500, 50) if quick else (2000, 10000, 1000)
    huge = 2_000 if quick else 100_000
    with scratch("metadata") as tmp:
        fill_seconds = fill_store(tmp / "cluster" / "meta" / "meta.sqlite3", "/huge", huge)
        with NodeCluster(tmp / "cluster", 4, mode="loopback") as cluster:
            ours = run_async(stager_ops(cluster.meta_url, creates, stats, lists, "/huge"))
            ours.update(loader_ops(cluster.meta_url, "/huge"))
        local = local_ops(tmp, creates, stats, lists, huge)
        stores, store_notes = store_rows(tmp / "stores", quick)
    ours.update(stores)
    result = _result(ours, local, huge, fill_seconds, quick, store_notes)
    result["aims"] = store_aims(stores)
    return result


def _result(ours: dict[str, tuple[float, str]], local: dict[str, tuple[float, str]],
            huge: int, fill_seconds: float, quick: bool,
            store_notes: list[str]) -> dict[str, Any]:
    rows = []
    for name, (per_s, detail) in ours.items():
        base = local.get(name)
        rows.append([name, r2(per_s), detail, r2(base[0]) if base else None,
                     base[1] if base else "", r2(per_s / base[0]) if base else None])
    return {
        "title": "Metadata operations",
        "command": "python -m bench metadata" + (" --quick" if quick else ""),
        "columns": ["operation", "stager per s", "stager detail", "local FS per s",
                    "local detail", "stager / local"],
        "rows": rows,
        "ratios": {f"{k} (stager / local)": r[5] for k, r in zip(ours, rows, strict=True)
                   if r[5] is not None},
        "aims": {},
        "notes": [
            "One client, default settings, against one metadata server process (SQLite, "
            "WAL, fsync on every commit) with 4 data servers registered; creates are "
            "empty files (Client.pipe of no bytes: one request, the gateway's PUT, whose "
            "create and commit are two transactions on the server, the commit fsynced; "
            f"'{PARALLEL} in flight' shares transactions through the store thread's group "
            f"commit; 'batches of {BATCH}' sends one create and one commit request of "
            f"{BATCH} files per batch, one transaction each).",
            f"The {huge:,}-entry directory was filled through the store interface "
            f"before the server started ({huge / fill_seconds:,.0f} files/s, not an API "
            "figure); the listing is timed through the client, in pages of 1,000.",
            f"Loader time to first batch: stager.Loader(format='files', batch_size=256) over "
            f"the {huge:,}-file directory, from construction to the first batch in hand "
            "(the files are empty, so this is the cost of resolving the dataset): first by "
            "paging through the directory listing, then from a dataset manifest recorded "
            "on it (what `stager stage` records), resolved by the metadata server in one "
            "request. Shown as 1/seconds so the table stays 'per s'; the detail column "
            "has the seconds.",
            "Local FS: the same operations on this machine's disk; creates there are made "
            "durable the way stager's are (fsync of file and directory).",
            "Rows named 'SQLite: ...', 'PostgreSQL, 1 server: ...' and 'PostgreSQL, 2 "
            "servers: ...' (bench/bench_metadata_pg.py): each store behind `stager up` "
            "(2 data servers; PostgreSQL a throwaway server on this machine, fsync on), "
            "the same operations through the client, one cluster after the other; the "
            "detail column has us/op. JuiceFS's published PostgreSQL figures, for "
            "reference: create 844 us/op, getattr 350 us/op, rename 1,478 us/op. In the "
            "in-flight and batch rows, us/op is 1 / rate, not a latency.",
            *store_notes,
        ],
        "plot": {"kind": "barh", "x": "operation", "y": ["stager per s", "local FS per s"],
                 "ylabel": "operations/s", "logy": True},
    }
