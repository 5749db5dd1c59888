"""A job-start storm: M ranks resolve one dataset's manifest at once (issue 19).

A 100,000-file dataset with a manifest: the files committed through the metadata
store's own interface before the servers start (as the metadata benchmark fills
its huge directory), the manifest recorded through the client.  Then M = 1, 16
and 64 clients in this one process, each its own AsyncClient (nothing shared on
the client side), ask for the manifest together, for three set-ups: SQLite,
PostgreSQL with one metadata server, PostgreSQL with two (the clients split
between them).  Each M has three rounds:

- cold: the manifest just stored again, so no server has it resolved;
- warm: the same, once it is resolved (the median of ``rounds`` rounds);
- revalidate: clients that hold it ask again with its ETag (304, no body).

Each round reports the time until all M have it and the metadata server
processes' CPU over the round (utime + stime from /proc/PID/stat, summed over the
servers) divided by M.  The warm round runs again with raw GETs that only read
the gzip'd bytes, and one copy's decode (inflate, JSON, Manifest) is timed in
this process, so the reader sees how much of the time is the clients' own
decoding on one GIL.
"""

from __future__ import annotations

import asyncio
import gzip
import time
from pathlib import Path
from typing import Any

import aiohttp

from stager.meta.store.base import MetaStore
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.meta.store.sqlite.store import SQLiteStore
from stager.protocol.manifest import Manifest, ManifestFile
from stager.testing import ProcessCluster
from stager.testing.postgres import PostgresServer, PostgresUnavailable, start_postgres

from .bench_metadata import fill
from .common import aim, cpu_seconds, median, new_client, r2, run_async, scratch

DATASET = "/jobstart"
CLIENTS = (1, 16, 64)
QUICK_CLIENTS = (1, 16)
# (name, store, metadata servers)
SETUPS = (("sqlite", "sqlite", 1), ("postgresql, 1 server", "postgresql", 1),
          ("postgresql, 2 servers", "postgresql", 2))


async def _fill(store: MetaStore, n: int) -> Manifest:
    try:
        uploads = await fill(store, DATASET, n)
    finally:
        store.close()
    now = time.time()
    return Manifest(DATASET, tuple(ManifestFile(u.path.rsplit("/", 1)[1], 0, now, u.file_id)
                                   for u in uploads), source="bench", created=now)


async def _record(url: str, manifest: Manifest) -> None:
    async with new_client(url) as c:
        await c.put_manifest(manifest)


async def storm(urls: list[str], pids: list[int], m: int, n: int, *, revalidate: bool = False,
                raw: bool = False) -> tuple[float, float]:
    """M clients ask for the manifest at once: (seconds until all have it, server CPU
    seconds over the round)."""
    clients = [new_client(urls[i % len(urls)]) for i in range(m)]
    sessions = [aiohttp.ClientSession(auto_decompress=False) for _ in range(m)] if raw else []
    try:
        if revalidate:          # each holds the manifest and its ETag first
            await asyncio.gather(*(c.get_manifest(DATASET) for c in clients))

        async def bytes_only(i: int) -> int:
            async with sessions[i].get(f"{urls[i % len(urls)]}/v1/manifest{DATASET}",
                                       headers={"Accept-Encoding": "gzip"}) as resp:
                assert resp.status == 200, resp.status
                return len(await resp.read())

        async def manifest(i: int) -> int:
            got = await clients[i].get_manifest(DATASET)
            assert got is not None and len(got.files) == n
            return n

        cpu = sum(cpu_seconds(p) for p in pids)
        start = time.perf_counter()
        await asyncio.gather(*((bytes_only if raw else manifest)(i) for i in range(m)))
        seconds = time.perf_counter() - start
        return seconds, sum(cpu_seconds(p) for p in pids) - cpu
    finally:
        for c in clients:
            await c.close()
        for s in sessions:
            await s.close()


def decode_seconds(url: str, rounds: int) -> float:
    """One client-side decode of the manifest (inflate, JSON, Manifest), median."""
    async def body() -> bytes:
        async with aiohttp.ClientSession(auto_decompress=False) as s, s.get(
                f"{url}/v1/manifest{DATASET}", headers={"Accept-Encoding": "gzip"}) as resp:
            return await resp.read()

    raw = run_async(body())
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        Manifest.decode(gzip.decompress(raw))
        times.append(time.perf_counter() - start)
    return median(times)


def one_setup(root: Path, kind: str, metas: int, n: int, rounds: int, clients: tuple[int, ...],
              pg: PostgresServer | None) -> tuple[list[dict[str, Any]], float]:
    """The rounds of one set-up (dicts of figures), and one copy's decode seconds."""
    url = pg.create_database() if pg is not None and kind == "postgresql" else ""
    store: MetaStore = PostgreSQLStore(url) if url else \
        SQLiteStore(root / "meta" / "meta.sqlite3")
    manifest = run_async(_fill(store, n))
    out = []
    with ProcessCluster(root, data_servers=1, fast=False, meta_store=url,
                        meta_servers=metas) as cluster:
        urls, pids = cluster.meta_urls, [cluster.meta_pid(i) for i in range(metas)]
        for m in clients:
            run_async(_record(urls[0], manifest))      # stored again: nothing cached
            t, cpu = run_async(storm(urls, pids, m, n))
            out.append({"m": m, "round": "cold", "s": t, "cpu": cpu / m})
            warm = [run_async(storm(urls, pids, m, n)) for _ in range(rounds)]
            raw = [run_async(storm(urls, pids, m, n, raw=True)) for _ in range(rounds)]
            out.append({"m": m, "round": "warm", "s": median([w[0] for w in warm]),
                        "cpu": median([w[1] for w in warm]) / m,
                        "raw_s": median([r[0] for r in raw])})
            t, cpu = run_async(storm(urls, pids, m, n, revalidate=True))
            out.append({"m": m, "round": "revalidate (304)", "s": t, "cpu": cpu / m})
        decode = decode_seconds(urls[0], max(rounds, 5))
    return out, decode


def run(quick: bool) -> dict[str, Any]:
    n = 1_000 if quick else 100_000
    rounds = 1 if quick else 3
    clients = QUICK_CLIENTS if quick else CLIENTS
    rows: list[list[Any]] = []
    warm: dict[tuple[str, int], dict[str, Any]] = {}
    decodes: list[float] = []
    skipped = ""
    with scratch("jobstart") as tmp:
        try:
            pg: PostgresServer | None = start_postgres()
        except PostgresUnavailable as exc:
            pg, skipped = None, str(exc)
        try:
            for name, kind, metas in SETUPS[:2] if quick else SETUPS:
                if kind == "postgresql" and pg is None:
                    continue
                figures, decode = one_setup(tmp / name.replace(", ", "-").replace(" ", ""),
                                            kind, metas, n, rounds, clients, pg)
                decodes.append(decode)
                for f in figures:
                    if f["round"] == "warm":
                        warm[name, f["m"]] = f
                    rows.append([f"{name}, M={f['m']}, {f['round']}", r2(f["s"]),
                                 r2(f["cpu"] * 1000),
                                 r2(f["raw_s"]) if "raw_s" in f else None,
                                 r2(f["m"] * decode)])
        finally:
            if pg is not None:
                pg.destroy()
    return _result(rows, warm, median(decodes), n, rounds, max(clients), quick, skipped)


def _result(rows: list[list[Any]], warm: dict[tuple[str, int], dict[str, Any]],
            decode: float, n: int, rounds: int, most: int, quick: bool, skipped: str
            ) -> dict[str, Any]:
    names = sorted({name for name, _ in warm})
    cpu_ms = max(warm[name, m]["cpu"] * 1000 for name, m in warm)
    spread = {name: warm[name, most]["s"] / warm[name, 1]["s"] for name in names}
    raw_spread = {name: warm[name, most]["raw_s"] / warm[name, 1]["raw_s"] for name in names}
    notes = [
        f"A {n:,}-file dataset (empty files, one directory) with a manifest naming them "
        "all; the files committed through the store interface before the servers "
        "started, the manifest through the client. `stager up` with one data server and "
        "the default settings, on loopback.",
        "M clients in this one process, each its own AsyncClient (its own connections, "
        "no manifest shared), ask for the manifest together; 'all have it s' is from the "
        "first request to the last client holding its parsed Manifest. 'server CPU ms "
        "per client' is the metadata server processes' utime + stime "
        "(/proc/PID/stat) over the round, summed over the servers, divided by M; the "
        "PostgreSQL server's own processes are not counted. /proc counts in ticks of "
        "10 ms, so a round's figure is a multiple of 10 ms / M (0 for a round under a "
        "tick).",
        "cold: the manifest was just stored again (put_manifest), so no metadata server "
        "has it resolved: one resolution per server (requests arriving together share "
        "it). warm: resolved before, served from the cache; median of "
        f"{rounds} round(s). revalidate: clients that already hold it send its ETag "
        "and get 304.",
        "'no client decode s': the warm round again with raw GETs that only read the "
        "gzip'd bytes (no inflate, no JSON, no Manifest). 'client decode s (M copies)': "
        f"M x one copy's decode measured in this process ({decode:.3f} s each, median of "
        "5 or more): "
        "the M clients of one process decode on one GIL, so this part grows with M "
        "however fast the server answers; ranks in separate processes decode in "
        "parallel.",
    ] + ([f"PostgreSQL rows skipped: {skipped}"] if skipped else []) + (
        [f"--quick: '{SETUPS[2][0]}' not run."] if quick else [])
    return {
        "title": "Job-start storm: M clients resolve one manifest at once",
        "command": "python -m bench jobstart" + (" --quick" if quick else ""),
        "columns": ["case", "all have it s", "server CPU ms per client",
                    "no client decode s", "client decode s (M copies)"],
        "rows": rows,
        "ratios": {f"{name}: {most} clients / 1 client, warm (all have it)": r2(v)
                   for name, v in spread.items()} | {
                   f"{name}: {most} clients / 1 client, warm, no client decode": r2(v)
                   for name, v in raw_spread.items()},
        "aims": {
            "warm server CPU ms per resolution (worst set-up and M)": aim(
                cpu_ms, "<= 20 ms", cpu_ms <= 20),
            f"{most} clients / 1 client, warm, all have it (worst set-up)": aim(
                max(spread.values()), "<= 2", max(spread.values()) <= 2),
        },
        "notes": notes,
        "plot": {"kind": "barh", "x": "case", "y": ["server CPU ms per client"],
                 "ylabel": "metadata server CPU ms per client", "logy": True},
    }
