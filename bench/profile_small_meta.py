"""``python -m bench.profile_small`` modes of the metadata server: create+commit
rates through the client, and the store thread's group commit alone."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

from .common import new_client, run_async


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
    from stager.meta.store.sqlite.store import SQLiteStore
    from stager.protocol.batch import CommitItem, CreateItem, one
    from stager.protocol.models import TargetInfo

    async def measure(root: Path, max_group: int) -> None:
        store = SQLiteStore(root / f"meta-{max_group}.sqlite3", max_group=max_group)
        service = MetaService(store, load_config(env={}))
        await service.start()
        for i in range(3):
            await service.register_target(TargetInfo(f"t{i}", f"n{i}", f"http://h{i}:1"))
        todo = iter(range(files))

        async def writer() -> None:
            for i in todo:
                upload, _ = one(await service.create([CreateItem(f"/d/f{i}")]))
                one(await service.commit([CommitItem(upload.file_id, 0, ())]))

        start = time.perf_counter()
        await asyncio.gather(*(writer() for _ in range(writers)))
        seconds = time.perf_counter() - start
        thread = store.thread
        print(f"group commit {'on ' if max_group > 1 else 'off'}: {files / seconds:,.0f} "
              f"files/s ({writers} writers; {thread.grouped_calls} of the {2 * files} store "
              f"writes shared {thread.groups} transactions)", flush=True)
        service.close()

    with tempfile.TemporaryDirectory(prefix="profile-group-") as tmp:
        for max_group in (1, 256, 1, 256):
            asyncio.run(measure(Path(tmp), max_group))

