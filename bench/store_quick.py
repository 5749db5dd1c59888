"""A quick look at the two metadata stores, at the store interface (no HTTP): create
(begin_uploads + commit_uploads of one, one at a time), stat, and creates with 64 in flight
(group commit), SQLite and a throwaway PostgreSQL side by side.

    python -m bench.store_quick [N]

Not the metadata benchmark (``python -m bench metadata``): no server, one process.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from stager.meta.store.base import MetaStore
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.meta.store.sqlite.store import SQLiteStore
from stager.testing.metastore import upload
from stager.testing.postgres import start_postgres


async def create(store: MetaStore, file_id: str, path: str) -> None:
    u = upload(file_id, path)
    await store.begin_uploads([u])
    await store.commit_uploads([(u.file_id, 1, (1,), 1.0)], now=1.0)


async def measure(name: str, store: MetaStore, n: int) -> None:
    await store.mkdir("/b", parents=True, exist_ok=True, now=1.0)
    t = time.perf_counter()
    for i in range(n):
        await create(store, f"s{i:08d}", f"/b/s{i}")
    creates = (time.perf_counter() - t) / n * 1e6
    t = time.perf_counter()
    for i in range(n):
        await store.stat(f"/b/s{i}")
    stats = (time.perf_counter() - t) / n * 1e6
    slots = asyncio.Semaphore(64)

    async def limited(i: int) -> None:
        async with slots:
            await create(store, f"c{i:08d}", f"/b/c{i}")

    t = time.perf_counter()
    await asyncio.gather(*(limited(i) for i in range(n)))
    rate = n / (time.perf_counter() - t)
    print(f"{name:10s}  create {creates:6.0f} us/op  stat {stats:5.0f} us/op  "
          f"create, 64 in flight {rate:6.0f} ops/s", flush=True)
    store.close()


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        await measure("sqlite", SQLiteStore(Path(d) / "meta.sqlite3"), n)
    pg = start_postgres()
    try:
        await measure("postgresql", PostgreSQLStore(pg.create_database()), n)
    finally:
        pg.destroy()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000))
