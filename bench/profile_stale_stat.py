"""What a read by path through a stale cached stat costs once the old version's chunks
are collected (stager/client/stale.py): the read finds the chunks gone, stats the path
again and reads the new version.

    python -m bench.profile_stale_stat [N]      # N rewrites (default 10)

An in-process cluster (3 data servers, SQLite); a writer client rewrites a 5-chunk
file (64 KiB chunks, stripe 3) while a reader holds its stat (``stat_cache_ttl``
600 s).  Printed: the median and the worst of the reader's ``Client.cat`` and of
``stager://``'s ``cat_ranges`` (two ranges) after the collection, and of a
``Client.cat`` through a good cached stat, wall time per call.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from stager import Client
from stager.config import load_config
from stager.fs import StagerFileSystem
from stager.protocol.models import LayoutSpec
from stager.testing import ThreadCluster

CHUNK = 64 * 1024
LAYOUT = LayoutSpec(chunk_size=CHUNK, stripe_count=3)


def chunks_left(cluster: ThreadCluster, file_id: str) -> bool:
    """Whether a data server still holds a chunk of ``file_id``."""
    folders = [cluster.root / f"data{i}" / "chunks" / file_id[:2] / file_id[2:4]
               for i in range(cluster.n)]
    return any(p.name.startswith(file_id) for d in folders for p in d.glob("*"))


def ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1e3:.1f} ms (worst {max(values) * 1e3:.1f})"


def main(n: int) -> None:
    cluster = ThreadCluster(Path(tempfile.mkdtemp(prefix="stale-")), 3)
    cluster.start()
    long = load_config({"stat_cache_ttl": 600}, env={})
    try:
        with Client(cluster.meta_url, config=load_config(env={})) as writer, \
                Client(cluster.meta_url, config=long) as reader:
            fs = StagerFileSystem(cluster.meta_url, config=long, skip_instance_cache=True)
            cat, ranges, good = [], [], []
            for i in range(n):
                path = f"/stale/f{i}"
                old = writer.pipe(path, b"a" * (5 * CHUNK), layout=LAYOUT).file_id or ""
                reader.cat(path)
                mid = writer.pipe(path, b"b" * (3 * CHUNK), layout=LAYOUT).file_id or ""
                while chunks_left(cluster, old):
                    time.sleep(0.02)
                t = time.perf_counter()
                assert reader.cat(path) == b"b" * (3 * CHUNK)
                cat.append(time.perf_counter() - t)
                t = time.perf_counter()
                reader.cat(path)
                good.append(time.perf_counter() - t)
                fs.cat_ranges([path], [0], [10])
                writer.pipe(path, b"c" * (4 * CHUNK), layout=LAYOUT)
                while chunks_left(cluster, mid):
                    time.sleep(0.02)
                t = time.perf_counter()
                assert fs.cat_ranges([path, path], [0, CHUNK], [10, CHUNK + 10]) == [b"c" * 10] * 2
                ranges.append(time.perf_counter() - t)
            fs.close()
        print(f"Client.cat through a stale stat: {ms(cat)}")
        print(f"cat_ranges through a stale stat: {ms(ranges)}")
        print(f"Client.cat through a good cached stat: {ms(good)}")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
