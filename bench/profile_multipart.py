"""What an S3 multipart upload costs, side by side on one ``stager up --s3-port 0``:

* the client layer (:class:`~stager.client.uploads.MultipartUploads`, no HTTP gateway):
  8 MiB parts, which lie in the file's 4 MiB chunks (completion copies nothing), and
  6 MiB parts, which do not (completion composes: every byte read back and written
  again), against ``AsyncClient.pipe`` of the same bytes;
* through the gateway: boto3's ``upload_file`` in 8 MiB parts (10 threads) against one
  PutObject of the same file, and ``Client.put``.

    python -m bench.profile_multipart [MIB]       # MIB of data (default 512)

Each row is the best of three rounds (the build machine has two cores shared with the
servers, so the spread is wide); MB/s of the data's size.

    python -m bench.profile_multipart copy [MIB] [ROUNDS]   # default 256 MiB, 3 rounds

UploadPartCopy's client side (:meth:`MultipartUploads.copy_part`, 4 parts at once) of a
MIB file into parts of 8 MiB at a chunk boundary (boto3's ``copy``), 8 MiB from inside a
chunk, and 64 MiB: the copying process's CPU seconds per GiB (all its threads: the
parts' md5s too), the best of ROUNDS; the cases alternate within each round.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from stager import AsyncClient, Client
from stager.client.uploads import MultipartUploads
from stager.config import load_config
from stager.testing.s3cluster import S3Cluster, boto3_client

MiB = 1 << 20
ROUNDS = 3


def best(fn: Callable[[], object]) -> float:
    times = []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


async def multipart(meta_url: str, path: str, data: bytes, part: int) -> tuple[float, int]:
    """Seconds to write ``data`` in ``part``-byte parts (4 at once) and complete; the
    bytes completion copied."""
    async with AsyncClient(meta_url, config=load_config(env={})) as client:
        uploads = MultipartUploads(client)
        t = time.perf_counter()
        up = await uploads.create(path)
        limit = asyncio.Semaphore(4)
        view = memoryview(data)

        async def one(n: int) -> tuple[int, str]:
            async with limit:
                piece = bytes(view[(n - 1) * part:n * part])
                return n, (await uploads.write_part(up.upload_id, n, piece, len(piece))).md5

        count = -(-len(data) // part)
        parts = await asyncio.gather(*(one(n) for n in range(1, count + 1)))
        done = await uploads.complete(up.upload_id, parts)
        return time.perf_counter() - t, done.copied


COPIES = (("8 MiB parts from a chunk boundary", 8 * MiB, 0),
          ("8 MiB parts from inside a chunk", 8 * MiB, MiB + 17),
          ("64 MiB parts from a chunk boundary", 64 * MiB, 0))


async def copy_cpu(meta_url: str, src: str, size: int, part: int, offset: int) -> float:
    """CPU seconds of this process to copy ``src`` from ``offset`` on in ``part``-byte
    parts (4 at once) into a new upload (aborted after)."""
    async with AsyncClient(meta_url, config=load_config(env={})) as client:
        uploads = MultipartUploads(client)
        up = await uploads.create(f"{src}.copy")
        limit = asyncio.Semaphore(4)

        async def one(n: int, start: int) -> None:
            async with limit:
                await uploads.copy_part(up.upload_id, n, src, start, min(start + part, size))

        t = time.process_time()
        await asyncio.gather(*(one(n, start) for n, start in
                               enumerate(range(offset, size, part), 1)))
        cpu = time.process_time() - t
        await uploads.abort(up.upload_id)
        return cpu


def copies(mib: int, rounds: int) -> None:
    size = mib * MiB
    with tempfile.TemporaryDirectory(prefix="profile-copy") as tmp, \
            S3Cluster(Path(tmp) / "c", data_servers=2) as s3:
        client = Client(s3.meta_url, config=load_config(env={}))
        client.pipe("/b/src", os.urandom(8 * MiB) * (size // (8 * MiB)))
        client.close()
        best_of: dict[str, float] = {}
        for r in range(rounds):
            for name, part, offset in (COPIES if r % 2 == 0 else COPIES[::-1]):
                cpu = asyncio.run(copy_cpu(s3.meta_url, "/b/src", size, part, offset))
                per_gib = cpu / ((size - offset) / (1 << 30))
                best_of[name] = min(best_of.get(name, per_gib), per_gib)
                print(f"round {r} {name:36s} {per_gib:5.2f} CPU s per GiB; load "
                      f"{os.getloadavg()[0]:.1f}", flush=True)
    print(f"{mib} MiB, UploadPartCopy, best of {rounds}:")
    for name, per_gib in best_of.items():
        print(f"  {name:36s} {per_gib:5.2f} CPU s per GiB (the copying process)")


async def pipe(meta_url: str, path: str, data: bytes) -> float:
    async with AsyncClient(meta_url, config=load_config(env={})) as client:
        t = time.perf_counter()
        await client.pipe(path, data)
        return time.perf_counter() - t


def main(mib: int) -> None:
    from boto3.s3.transfer import TransferConfig

    size = mib * MiB
    data = os.urandom(8 * MiB) * (size // (8 * MiB))
    with tempfile.TemporaryDirectory(prefix="profile-multipart") as tmp, \
            S3Cluster(Path(tmp) / "c", data_servers=2) as s3:
        src = Path(tmp) / "src.bin"
        src.write_bytes(data)
        mb = size / 1e6
        rows = []
        for name, part in (("in place (8 MiB parts)", 8 * MiB), ("composed (6 MiB parts)",
                                                                  6 * MiB)):
            runs = [asyncio.run(multipart(s3.meta_url, f"/b/{part}-{r}", data, part))
                    for r in range(ROUNDS)]
            secs, copied = min(runs)
            rows.append((f"MultipartUploads, {name}", secs, f"copied {copied >> 20} MiB"))
        rows.append(("AsyncClient.pipe", min(asyncio.run(pipe(s3.meta_url, f"/b/pipe{r}", data))
                                             for r in range(ROUNDS)), ""))
        s3c = boto3_client(s3.url)
        s3c.create_bucket(Bucket="bench")
        parts = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB,
                               max_concurrency=10)
        whole = TransferConfig(multipart_threshold=1 << 40)
        rows.append(("boto3 upload_file, 8 MiB parts x10", best(
            lambda: s3c.upload_file(str(src), "bench", "parts", Config=parts)), ""))
        rows.append(("boto3 upload_file, one PutObject", best(
            lambda: s3c.upload_file(str(src), "bench", "whole", Config=whole)), ""))
        client = Client(s3.meta_url, config=load_config(env={}))
        rows.append(("Client.put", best(lambda: client.put(str(src), "/bench/put")), ""))
        client.close()
    print(f"{mib} MiB, best of {ROUNDS}:")
    for name, secs, note in rows:
        print(f"  {name:42s} {secs:6.2f} s  {mb / secs:6.0f} MB/s  {note}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["copy"]:
        copies(int(sys.argv[2]) if len(sys.argv) > 2 else 256,
               int(sys.argv[3]) if len(sys.argv) > 3 else 3)
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 512)
