"""What a data server's TLS send costs per GB, by read size: ``python -m bench.profile_tls_send``.

Over TLS a data server cannot ``sendfile``: :func:`stager.web.sendfile.send_region`
reads the chunk in a worker thread ``FALLBACK_PIECE`` bytes at a time and writes
each piece through asyncio's TLS transport.  This runs that same loop in bare
aiohttp servers over TLS, one per ``--pieces`` size (KiB), each a process of its
own, and reads 4 MiB chunks from each in turn with stager's raw read client
(4 at a time), round by round; it prints each server's CPU seconds per GB sent
(its process's rusage) and MB/s.  Only the piece size differs between the
servers, so the CPU ratio is what the piece size costs.

A size ``R:W`` reads ``R`` KiB at a time and hands the TLS transport
``W`` KiB views of it at a time: the transport encrypts each write into its
outgoing buffer and copies that out whole, so a smaller write keeps those
buffers in the CPU's cache.  The servers run on the loop the data servers run
on: stock asyncio's, their default under ``event_loop`` "auto" (stager/cli/servers.py:
its sendfile is zero-copy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request

from aiohttp import web

from stager.aio import loop_factory
from stager.auth.tls import client_context, ensure_cluster_tls, server_context
from stager.dataplane import rawhttp
from stager.web.server import start_sites

CHUNK = 4 << 20
FILE_CHUNKS = 16


def _sizes(spec: str) -> tuple[int, int]:
    """(read, write) bytes of a ``R`` or ``R:W`` size in KiB."""
    read, _, write = spec.partition(":")
    return int(read) << 10, int(write or read) << 10


async def serve(spec: str, path: str, tls_dir: str) -> None:
    """The server: ``send_region``'s fallback loop with ``spec``; prints its port."""
    piece, write = _sizes(spec)
    fd = os.open(path, os.O_RDONLY)
    sent = 0

    async def chunk(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        offset = int(request.match_info["chunk"].split(".")[1]) % FILE_CHUNKS * CHUNK
        response = web.StreamResponse(headers={"X-Stager-Crc32c": "00000000"})
        response.content_length = CHUNK
        await response.prepare(request)
        end = offset + CHUNK
        while offset < end:
            data = await asyncio.to_thread(os.pread, fd, min(piece, end - offset), offset)
            view = memoryview(data)
            for at in range(0, len(data), write):
                await response.write(view[at:at + write])
            offset += len(data)
        await response.write_eof()
        sent += CHUNK
        return response

    async def stats(request: web.Request) -> web.Response:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return web.json_response({"cpu": usage.ru_utime + usage.ru_stime, "sent": sent})

    files = ensure_cluster_tls(tls_dir)
    app = web.Application()
    app.router.add_get("/v1/chunks/{chunk}", chunk)
    app.router.add_get("/stats", stats)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await start_sites(runner, "127.0.0.1", 0,
                      ssl_context=server_context(files.cert, files.key))
    print(runner.addresses[0][1], flush=True)
    await asyncio.Event().wait()


async def read(port: int, ctx: object, chunks: int) -> None:
    pool = rawhttp.RawPool(limit=4, connect_timeout=30, read_timeout=30,
                           ssl_context=ctx)  # type: ignore[arg-type]
    sem = asyncio.Semaphore(4)

    async def one(i: int) -> None:
        async with sem:
            await pool.request(f"https://127.0.0.1:{port}", "GET", f"/v1/chunks/{'ab' * 16}.{i}",
                               {}, None, memoryview(bytearray(CHUNK)))
    try:
        await asyncio.gather(*(one(i) for i in range(chunks)))
    finally:
        pool.close()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profile_tls_send",
                                description=__doc__.splitlines()[0])
    p.add_argument("--pieces", default="1024,4096,4096:256",
                   help="KiB per read (R) or per read and per write (R:W), comma-separated")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--chunks", type=int, default=64, help="4 MiB chunks read per round")
    p.add_argument("--serve", nargs=3, metavar=("PIECE", "FILE", "TLS_DIR"),
                   help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        with asyncio.Runner(loop_factory=loop_factory("asyncio")) as runner:
            runner.run(serve(args.serve[0], args.serve[1], args.serve[2]))
        return
    pieces = args.pieces.split(",")
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/chunks"
        with open(path, "wb") as fh:
            fh.write(os.urandom(FILE_CHUNKS * CHUNK))
        files = ensure_cluster_tls(f"{d}/tls")
        ctx = client_context(files.ca_cert)
        servers: dict[str, tuple[subprocess.Popen[str], int]] = {}
        try:
            for piece in pieces:
                proc = subprocess.Popen([sys.executable, "-m", "bench.profile_tls_send",
                                         "--serve", piece, path, f"{d}/tls"],
                                        stdout=subprocess.PIPE, text=True)
                assert proc.stdout is not None
                servers[piece] = (proc, int(proc.stdout.readline()))
            got: dict[str, list[tuple[float, float]]] = {piece: [] for piece in pieces}
            for r in range(args.rounds + 1):        # round 0 warms up
                for piece in (pieces if r % 2 == 0 else pieces[::-1]):
                    port = servers[piece][1]
                    before, start = _stats(port, ctx), time.perf_counter()
                    asyncio.run(read(port, ctx, args.chunks))
                    seconds, after = time.perf_counter() - start, _stats(port, ctx)
                    gb = (after["sent"] - before["sent"]) / 1e9
                    if r:
                        got[piece].append(((after["cpu"] - before["cpu"]) / gb, gb / seconds))
            for piece, figures in got.items():
                cpu = sorted(c for c, _ in figures)[len(figures) // 2]
                rate = sorted(g for _, g in figures)[len(figures) // 2]
                print(f"pieces of {piece:>9} KiB: server CPU {cpu:.3f} s/GB (median of "
                      f"{' / '.join(f'{c:.2f}' for c, _ in figures)}), {rate * 1e3:.0f} MB/s")
        finally:
            for proc, _ in servers.values():
                proc.kill()
                proc.wait()


def _stats(port: int, ctx: object) -> dict[str, float]:
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/stats",
                                context=ctx) as resp:  # type: ignore[arg-type]
        return json.load(resp)


if __name__ == "__main__":
    main()
