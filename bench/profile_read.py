"""The read path under a profiler: ``python -m bench.profile_read [options]``.

Starts four data servers on loopback, stores one file, then reads it again and
again with one client, printing MB/s and the client's CPU seconds per GB for
each round.  Run it under py-spy to see where a read's time goes::

    py-spy record -r 200 -o read.svg -- python -m bench.profile_read --rounds 10
    py-spy record -r 200 -f raw -o data.txt --pid <a data server's pid> --duration 5

(``--pids FILE`` writes the servers' pids, ``--wait S`` pauses before reading so
a profiler can attach.)  ``--aiohttp`` reads through aiohttp as before
:mod:`stager.dataplane.rawhttp`; ``--client-loop uvloop`` runs the client on uvloop;
``--server-loop uvloop`` the data servers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from stager.testing.nodes import NodeCluster

from .common import MiB, new_client, scratch, upload_file, write_local


async def rounds(meta_url: str, out: memoryview, n: int, mode: str, raw: bool) -> None:
    async with new_client(meta_url) as c:
        c.options.raw_reads = raw
        info = await c.stat("/data.bin")
        for _ in range(n):
            start, cpu = time.perf_counter(), time.process_time()
            if mode == "read_into":
                await c.read_into("/data.bin", out)
            else:
                async for _piece in c.reader(info).stream():
                    pass
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
            gb = len(out) / 1e9
            print(f"{mode}: {gb / seconds * 1e3:7.0f} MB/s   client CPU {cpu / gb:.3f} s/GB",
                  flush=True)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profile_read", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--mode", choices=("read_into", "stream"), default="read_into")
    p.add_argument("--aiohttp", action="store_true", help="reads through aiohttp (before)")
    p.add_argument("--client-loop", choices=("asyncio", "uvloop"), default="asyncio")
    p.add_argument("--server-loop", choices=("asyncio", "uvloop"), default="asyncio")
    p.add_argument("--pids", type=Path, help="write the servers' pids here (JSON)")
    p.add_argument("--wait", type=float, default=0.0, help="seconds to wait before reading")
    args = p.parse_args()
    size = args.size_mib * MiB
    with scratch("profile") as tmp:
        local = write_local(tmp / "data.bin", size)
        out = memoryview(bytearray(size))
        with NodeCluster(tmp / "cluster", 4, mode="loopback",
                         env={"STAGER_EVENT_LOOP": args.server_loop}) as cluster:
            asyncio.run(_load(cluster.meta_url, local))
            if args.pids:
                args.pids.write_text(json.dumps([p.pid for p in cluster.procs]))
            time.sleep(args.wait)
            job = rounds(cluster.meta_url, out, args.rounds, args.mode, not args.aiohttp)
            if args.client_loop == "uvloop":
                import uvloop

                uvloop.run(job)
            else:
                asyncio.run(job)


async def _load(meta_url: str, local: Path) -> None:
    async with new_client(meta_url) as c:
        await upload_file(c, local, "/data.bin")


if __name__ == "__main__":
    main()
