"""Metadata on each store, side by side: SQLite, PostgreSQL behind one metadata
server, and PostgreSQL behind two (issue 19's rows of ``python -m bench metadata``).

Each is a ``stager up`` cluster (:class:`~stager.testing.ProcessCluster`, two
data servers) started in turn on this machine; PostgreSQL is a throwaway server
(:mod:`stager.testing.postgres`), a fresh database for each cluster.  The same
operations, through the client: create+commit one at a time, stat, listing a
1,000-entry directory, rename, one ``write_many`` of 1,000 empty files (one
create-batch and one commit-batch request), and creates from two clients with
16 in flight each -- both on the one server, or one client per server -- whose
rates give the two-server / one-server ratio.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from stager.client import AsyncClient
from stager.config import load_config
from stager.testing import ProcessCluster
from stager.testing.cluster import wait_for_targets
from stager.testing.postgres import PostgresUnavailable, start_postgres

from .common import many_timed

PARALLEL = 16
LISTED = 1000
STORES = ("SQLite", "PostgreSQL, 1 server", "PostgreSQL, 2 servers")

Rows = dict[str, tuple[float, str]]      # {operation: (per second, detail)}


def store_rows(root: Path, quick: bool) -> tuple[Rows, list[str]]:
    """Rows for each store, named ``"<store>: <operation>"``, and notes (one saying why
    PostgreSQL is missing where it could not start)."""
    n = 100 if quick else 1000
    rows: Rows = {}
    notes: list[str] = []
    rows.update(_one(root / "sqlite", "SQLite", "", 1, n))
    try:
        pg = start_postgres()
    except PostgresUnavailable as exc:
        return rows, [f"No PostgreSQL rows: {exc}"]
    try:
        rows.update(_one(root / "pg1", STORES[1], pg.create_database(), 1, n))
        rows.update(_one(root / "pg2", STORES[2], pg.create_database(), 2, n))
    finally:
        pg.destroy()
    one = rows.get(f"{STORES[1]}: {_SPREAD}")
    two = rows.get(f"{STORES[2]}: {_SPREAD}")
    if one and two:
        notes.append(f"Two PostgreSQL metadata servers / one, creates from two clients "
                     f"with {PARALLEL} in flight each: {two[0] / one[0]:.2f}x (aim >= 1.6x; "
                     "every server, client and PostgreSQL share this machine's cores).")
    return rows, notes


_SPREAD = f"create+commit (0 B), 2 clients x {PARALLEL} in flight"


def _one(root: Path, store: str, url: str, servers: int, n: int) -> Rows:
    with ProcessCluster(root, data_servers=2, fast=False, meta_store=url,
                        meta_servers=servers) as cluster:
        for meta in cluster.meta_urls:
            wait_for_targets(meta, 2, timeout=60)
        measured = asyncio.run(_ops(cluster.meta_urls, n))
    return {f"{store}: {name}": value for name, value in measured.items()}


def _client(urls: list[str]) -> AsyncClient:
    return AsyncClient(urls, config=load_config(env={}))


async def _ops(urls: list[str], n: int) -> Rows:
    out: Rows = {}
    # one client per server where there are two (each fails over to the other)
    first, second = _client(urls), _client(urls[1:] + urls[:1])
    try:
        c = first
        await c.mkdir("/seq")
        t = await many_timed(lambda i: c.pipe(f"/seq/f{i:06d}", b""), n, 1)
        out["create+commit (0 B), 1 at a time"] = _rate(n, t, "files")
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
        t = await _spread([first, second], n)
        out[_SPREAD] = _rate(n, t, "files")
    finally:
        await first.close()
        await second.close()
    return out


async def _spread(clients: list[AsyncClient], n: int) -> float:
    """Seconds for ``n`` creates from the clients, ``PARALLEL`` in flight each."""
    start = time.perf_counter()
    await asyncio.gather(*(
        many_timed(lambda i, c=c, k=k: c.pipe(f"/par{k}/f{i:06d}", b""), n // len(clients),
                   PARALLEL) for k, c in enumerate(clients)))
    return time.perf_counter() - start


def _rate(count: int, seconds: float, what: str) -> tuple[float, str]:
    return count / seconds, f"{count} {what}, {seconds / count * 1e6:,.0f} us/op"


