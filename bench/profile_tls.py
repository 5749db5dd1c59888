"""What TLS costs the data path: ``python -m bench.profile_tls [--size MiB] [--rounds N]``.

Runs ``stager up`` (processes) twice, plain and ``--tls``, with ``--data-servers``
data servers; one :class:`~stager.AsyncClient` puts one file of ``--size`` MiB,
then reads it whole ``--rounds`` times into one buffer, with the raw read
client (:mod:`stager.dataplane.rawhttp`, ``recv_into``) and through aiohttp.
Prints the best round's MB/s and the client's CPU seconds per GB read.
Over TLS the data servers cannot ``sendfile`` (the bytes are encrypted on the
way out), so the figures bound what TLS costs on loopback, where the network
is not the limit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

from stager import AsyncClient
from stager.config import load_config
from stager.testing import ProcessCluster

MiB = 1 << 20


async def measure(url: str, ca_file: str, size: int, rounds: int,
                  raw: bool) -> tuple[float, float, float | None]:
    """(read MB/s, client CPU s/GB, put MB/s or None when the file was there)."""
    async with AsyncClient(url, config=load_config({"ca_file": ca_file}, env={})) as c:
        c.options.raw_reads = raw
        wrote = None
        if not await c.exists("/tls-probe.bin"):
            blob = os.urandom(size)
            start = time.perf_counter()
            await c.pipe("/tls-probe.bin", blob)
            wrote = size / (time.perf_counter() - start) / 1e6
        out = memoryview(bytearray(size))
        best = (float("inf"), 0.0)
        for _ in range(rounds):
            cpu, start = time.process_time(), time.perf_counter()
            await c.read_into("/tls-probe.bin", out)
            best = min(best, (time.perf_counter() - start, time.process_time() - cpu))
        return size / best[0] / 1e6, best[1] / (size / 1e9), wrote


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=256, help="MiB (default 256)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--data-servers", type=int, default=2)
    args = p.parse_args()
    for tls in (False, True):
        with tempfile.TemporaryDirectory() as root, \
                ProcessCluster(root, args.data_servers, tls=tls) as cluster:
            for raw in (True, False):
                mbs, cpu, wrote = asyncio.run(measure(cluster.meta_url, cluster.ca_file,
                                                      args.size * MiB, args.rounds, raw))
                put = f"   put {wrote:.0f} MB/s" if wrote else ""
                print(f"{'tls  ' if tls else 'plain'} {'raw    ' if raw else 'aiohttp'} "
                      f"read {mbs:6.0f} MB/s  client CPU {cpu:.2f} s/GB{put}", flush=True)


if __name__ == "__main__":
    main()
