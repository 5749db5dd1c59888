"""Metadata on each store, side by side: SQLite, PostgreSQL behind one metadata
server, and PostgreSQL behind two (issue 19's rows of ``python -m bench metadata``).

Each is a ``stager up`` cluster (:class:`~stager.testing.ProcessCluster`, two
data servers) started in turn on this machine; PostgreSQL is a throwaway server
(:mod:`stager.testing.postgres`), a fresh database for each cluster.  The same
operations, through the client: an empty file created one at a time (one request,
the gateway's PUT, which creates and commits it), a 1 KiB file (create, the chunk
written to a data server, commit), stat, listing a
1,000-entry directory, rename, one ``write_many`` of 1,000 empty files (one
batched create and one batched commit request), and creates from two clients with
16 in flight each -- both on the one server, or one client per server -- whose
rates give the two-server / one-server ratio.  While those creates run, the machine's
busy cores and the metadata servers' CPU are read from ``/proc``: whether the one
server was the bottleneck, or the machine was.  A row of ``GET /v1/health`` through
the same client gives the floor under every row: a request and its answer, with no
store behind it.

The rows named '..., store interface' time the same create, stat and rename at the
store interface in this process (no HTTP, no metadata server): the position of
JuiceFS's client, which talks to its metadata engine directly, and so the one its
published figures compare with.  On PostgreSQL a ``SELECT 1`` through the store's
pool gives the floor under them: one round trip to the database.  A create
whose upload is begun and committed together is what a small file's gateway PUT asks
of its store (the record queued right behind by its commit): on PostgreSQL the two
run as one statement, so the check and one more round trip.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from stager.client import AsyncClient
from stager.config import load_config
from stager.meta.store.base import MetaStore
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.meta.store.sqlite.store import SQLiteStore
from stager.protocol.routes import route
from stager.testing import ProcessCluster
from stager.testing.cluster import wait_for_targets
from stager.testing.metastore import upload
from stager.testing.postgres import PostgresUnavailable, start_postgres

from .common import aim, cpu_seconds, machine_busy, many_timed

PARALLEL = 16
LISTED = 1000
STORES = ("SQLite", "PostgreSQL, 1 server", "PostgreSQL, 2 servers")

Rows = dict[str, tuple[float, str]]      # {operation: (per second, detail)}


def store_rows(root: Path, quick: bool) -> tuple[Rows, list[str]]:
    """Rows for each store, named ``"<store>: <operation>"``, and notes (one saying why
    PostgreSQL is missing where it could not start)."""
    n = 40 if quick else 1000
    rows: Rows = {}
    notes: list[str] = []
    load: dict[str, str] = {}
    rows.update(_one(root / "sqlite", "SQLite", "", 1, n, load))
    rows.update(_interface("SQLite, store interface",
                           SQLiteStore(root / "interface" / "meta.sqlite3"), n))
    try:
        pg = start_postgres()
    except PostgresUnavailable as exc:
        return rows, [f"No PostgreSQL rows: {exc}"]
    try:
        rows.update(_one(root / "pg1", STORES[1], pg.create_database(), 1, n, load))
        if quick:       # a smoke test: the two-server cluster runs in the full suite
            notes.append(f"--quick: '{STORES[2]}' not run.")
        else:
            rows.update(_one(root / "pg2", STORES[2], pg.create_database(), 2, n, load))
        rows.update(_interface("PostgreSQL, store interface",
                               PostgreSQLStore(pg.create_database()), n))
    finally:
        pg.destroy()
    one = rows.get(f"{STORES[1]}: {_SPREAD}")
    two = rows.get(f"{STORES[2]}: {_SPREAD}")
    if one and two:
        notes.append(f"Two PostgreSQL metadata servers / one, creates from two clients "
                     f"with {PARALLEL} in flight each: {two[0] / one[0]:.2f}x (aim >= 1.6x; "
                     "every server, client and PostgreSQL share this machine's cores).")
    notes += [f"While '{_SPREAD}' ran, {store}: {what}." for store, what in load.items()]
    return rows, notes


_SPREAD = f"create (0 B), 2 clients x {PARALLEL} in flight"

# issue 19's aims, from JuiceFS's published PostgreSQL figures: (row, us/op at most)
_LATENCY_AIMS = [("PostgreSQL, store interface: stat, 1 at a time", 350),
                 ("PostgreSQL, store interface: create (0 B), 1 at a time", 844),
                 (f"{STORES[1]}: stat, 1 at a time", 350),
                 (f"{STORES[1]}: create (0 B), 1 at a time", 844)]


def store_aims(rows: Rows) -> dict[str, dict[str, Any]]:
    """The aims of the rows that ran: latencies in us/op, and two servers / one."""
    aims = {}
    for name, most in _LATENCY_AIMS:
        if name in rows:
            us = 1e6 / rows[name][0]
            aims[f"{name} (us/op)"] = aim(us, f"<= {most}", us <= most)
    one = rows.get(f"{STORES[1]}: {_SPREAD}")
    two = rows.get(f"{STORES[2]}: {_SPREAD}")
    if one and two:
        aims["PostgreSQL: 2 servers / 1, creates in flight"] = aim(
            two[0] / one[0], ">= 1.6", two[0] / one[0] >= 1.6)
    return aims


def _one(root: Path, store: str, url: str, servers: int, n: int,
         load: dict[str, str]) -> Rows:
    with ProcessCluster(root, data_servers=2, fast=False, meta_store=url,
                        meta_servers=servers) as cluster:
        for meta in cluster.meta_urls:
            wait_for_targets(meta, 2, timeout=60)
        pids = [cluster.meta_pid(i) for i in range(servers)]
        measured, load[store] = asyncio.run(_ops(cluster.meta_urls, n, pids))
    return {f"{store}: {name}": value for name, value in measured.items()}


def _client(urls: list[str]) -> AsyncClient:
    return AsyncClient(urls, config=load_config(env={}))


async def _ops(urls: list[str], n: int, pids: list[int]) -> tuple[Rows, str]:
    out: Rows = {}
    # one client per server where there are two (each fails over to the other)
    first, second = _client(urls), _client(urls[1:] + urls[:1])
    try:
        c = first
        await c.mkdir("/seq")
        health = route("health")
        t = await many_timed(lambda i: c.meta.request(health), n, 1)
        out["GET /v1/health, 1 at a time (the HTTP floor)"] = _rate(n, t, "requests")
        t = await many_timed(lambda i: c.pipe(f"/seq/f{i:06d}", b""), n, 1)
        out["create (0 B), 1 at a time"] = _rate(n, t, "files")
        t = await many_timed(lambda i: c.pipe(f"/small/f{i:06d}", b"x" * 1024), n, 1)
        out["create+write+commit (1 KiB), 1 at a time"] = _rate(n, t, "files")
        t = await many_timed(lambda i: c.stat(f"/seq/f{i % n:06d}", cached=False), n, 1)
        out["stat, 1 at a time"] = _rate(n, t, "stats")
        t = await many_timed(lambda i: c.rename(f"/seq/f{i:06d}", f"/seq/r{i:06d}"), n, 1)
        out["rename, 1 at a time"] = _rate(n, t, "renames")
        start = time.perf_counter()
        done = await c.write_many([(f"/batch/f{i:05d}", b"") for i in range(LISTED)])
        t = time.perf_counter() - start
        if any(isinstance(r, Exception) for r in done):
            raise AssertionError(f"write_many failed: {done}")
        out[f"write_many of {LISTED:,} (0 B): files/s"] = _rate(LISTED, t, "files")
        lists = max(10, n // 10)
        t = await many_timed(lambda i: c.ls("/batch"), lists, 1)
        out[f"list a {LISTED:,}-entry directory"] = _rate(lists, t, "listings")
        busy, cpu = machine_busy(), [cpu_seconds(p) for p in pids]
        t = await _spread([first, second], n)
        busy = (machine_busy() - busy) / t
        cpu = [(cpu_seconds(p) - c) / t for p, c in zip(pids, cpu, strict=True)]
        out[_SPREAD] = _rate(n, t, "files")
    finally:
        await first.close()
        await second.close()
    return out, (f"the machine's {os.cpu_count()} cores were {busy:.2f} cores busy, the "
                 "metadata server" + ("s " if len(cpu) > 1 else " ")
                 + " and ".join(f"{c:.2f}" for c in cpu) + " cores")


async def _spread(clients: list[AsyncClient], n: int) -> float:
    """Seconds for ``n`` creates from the clients, ``PARALLEL`` in flight each."""
    start = time.perf_counter()
    await asyncio.gather(*(
        many_timed(lambda i, c=c, k=k: c.pipe(f"/par{k}/f{i:06d}", b""), n // len(clients),
                   PARALLEL) for k, c in enumerate(clients)))
    return time.perf_counter() - start


def _interface(name: str, store: MetaStore, n: int) -> Rows:
    """``name``'s rows: create (what the metadata server asks of its store: the check,
    the upload begun, its commit; and with the last two queued together, as for a
    small gateway PUT), stat and rename, one at a time, in this process."""
    async def ops() -> Rows:
        await store.mkdir("/i", parents=False, exist_ok=False, now=1.0)

        async def create(i: int) -> None:
            u = upload(f"i{i:08d}", f"/i/f{i:06d}")
            await store.check_creates([(u.path, True, True)])
            await store.begin_uploads([u])
            await store.commit_uploads([(u.file_id, 0, (), 1.0)], now=1.0)

        out: Rows = {}
        if isinstance(store, PostgreSQLStore):      # what any call of the store costs
            t = await many_timed(lambda i: store.db.read(lambda c: c.fetchval("SELECT 1")),
                                 n, 1)
            out["SELECT 1, 1 at a time (the database floor)"] = _rate(n, t, "queries")
        async def put(i: int) -> None:
            u = upload(f"p{i:08d}", f"/i/p{i:06d}")
            await store.check_creates([(u.path, True, True)])
            await asyncio.gather(store.begin_uploads([u]),
                                 store.commit_uploads([(u.file_id, 0, (), 1.0)], now=1.0))

        t = await many_timed(create, n, 1)
        out["create (0 B), 1 at a time"] = _rate(n, t, "files")
        t = await many_timed(put, n, 1)
        out["create (0 B), begun and committed together, 1 at a time"] = _rate(n, t, "files")
        t = await many_timed(lambda i: store.stat(f"/i/f{i:06d}"), n, 1)
        out["stat, 1 at a time"] = _rate(n, t, "stats")
        t = await many_timed(lambda i: store.rename(f"/i/f{i:06d}", f"/i/r{i:06d}",
                                                    overwrite=False, now=2.0), n, 1)
        out["rename, 1 at a time"] = _rate(n, t, "renames")
        return out

    async def measured() -> Rows:
        try:
            return await ops()
        finally:
            store.close()

    return {f"{name}: {op}": value for op, value in asyncio.run(measured()).items()}


def _rate(count: int, seconds: float, what: str) -> tuple[float, str]:
    return count / seconds, f"{count} {what}, {seconds / count * 1e6:,.0f} us/op"


