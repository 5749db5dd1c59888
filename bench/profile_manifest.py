"""Where a manifest's time goes, without HTTP: the metadata service's cold
resolution, a cached (warm) answer, the 304 check, and one client-side decode.

    python -m bench.profile_manifest [N]      # N files (default 100,000), SQLite

One process, CPU from ``time.process_time``; not the job-start benchmark
(``python -m bench jobstart``), which runs servers and many clients.
"""

from __future__ import annotations

import asyncio
import gzip
import sys
import tempfile
import time
from pathlib import Path

from stager.config import Config
from stager.meta.service import MetaService
from stager.meta.sqlite import SQLiteStore
from stager.protocol.manifest import Manifest

from .bench_metadata import fill


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        service = MetaService(SQLiteStore(Path(tmp) / "meta.sqlite3"), Config())
        try:
            uploads = await fill(service.store, "/ds", n)
            await service.put_manifest("/ds", {"files": [
                {"path": u.path.rsplit("/", 1)[1], "size": 0, "mtime": 1.0,
                 "file_id": u.file_id} for u in uploads]})
            for label in ("cold", "warm", "warm"):
                cpu, wall = time.process_time(), time.perf_counter()
                snapshot = await service.get_manifest("/ds")
                print(f"{label:5s} resolution: {time.perf_counter() - wall:.4f} s, "
                      f"{time.process_time() - cpu:.4f} s CPU")
            cpu = time.process_time()
            await service.manifest_etag("/ds")
            print(f"304 check: {time.process_time() - cpu:.5f} s CPU")
            print(f"JSON {snapshot.size:,} bytes, gzip'd {len(snapshot.gzipped):,}")
            for _ in range(3):
                start = time.perf_counter()
                Manifest.decode(gzip.decompress(snapshot.gzipped))
                print(f"client decode: {time.perf_counter() - start:.3f} s")
        finally:
            service.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000))
