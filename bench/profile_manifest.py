"""Where a manifest's time goes, without HTTP: the metadata service's cold
resolution, a cached (warm) answer, the 304 check, and one client-side decode.

    python -m bench.profile_manifest [N]      # N files (default 100,000), SQLite

One process, CPU from ``time.process_time``; not the job-start benchmark
(``python -m bench jobstart``), which runs servers and many clients.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from stager.config import Config
from stager.meta.service import MetaService
from stager.meta.store.sqlite.store import SQLiteStore

from .bench_metadata import fill
from .profile_decode import decode_after, decode_before, median_seconds


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
            old = median_seconds(lambda: decode_before(snapshot.gzipped), 3)
            new = median_seconds(lambda: decode_after(snapshot.gzipped), 3)
            print(f"client decode, median of 3: before issue 19 {old[0]:.3f} s "
                  f"({old[1]:.3f} s CPU), now {new[0]:.3f} s ({new[1]:.3f} s CPU): "
                  f"{old[1] / new[1]:.1f}x less CPU")
        finally:
            service.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000))
