"""Loopback ceiling: stager's read rate against this machine's own limits.

Four data servers on 127.0.0.1 (no caps), the file in the page cache.  In the
same run, round by round: stager's client (parallel ``read_into`` a preallocated
buffer, the sequential readahead stream, the sync file API, ``read()`` through its
fsspec filesystem), a plain ``readinto``
of the same bytes from the page cache, nginx serving the same bytes read with
fsspec's HTTP filesystem and with aiohttp ranged GETs, and one TCP stream over
loopback (iperf3 and a Python socket pair).  The data servers run twice, on
the stock asyncio loop (zero-copy ``sendfile``, the default) and on uvloop.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from math import nan
from pathlib import Path
from typing import Any

import fsspec

from stager import Client
from stager.config import load_config
from stager.testing.nodes import NodeCluster

from . import baselines as B
from .common import (
    GiB,
    MiB,
    aim,
    interleaved,
    median,
    new_client,
    r2,
    rate,
    run_async,
    scratch,
    timed,
    upload_file,
    write_local,
)

DATA_SERVERS = 4
HEADLINE = "stager read_into, parallel"
BEFORE = "stager read_into, parallel, reads through aiohttp (before rawhttp)"
UVLOOP = "stager read_into, parallel, data servers on uvloop"
PAGE_CACHE = "page cache readinto (local file)"
FSSPEC_CAT = "nginx + fsspec HTTP cat_file"
FSSPEC_SEQ = "nginx + fsspec HTTP open/read 8 MiB"
STAGER_FSSPEC = "stager fsspec open/read 8 MiB"
RANGED = "nginx + aiohttp ranged GETs (4 MiB x 8)"
SOCKETS = "TCP socket pair, Python, 1 stream"
IPERF = "TCP iperf3, 1 stream"


def _stager_cases(url: str, uv_url: str, out: memoryview) -> dict[str, Any]:
    async def read_into(meta_url: str, raw: bool = True) -> int:
        async with new_client(meta_url) as c:
            c.options.raw_reads = raw
            return await c.read_into("/data.bin", out)

    async def stream() -> int:
        async with new_client(url) as c:
            info = await c.stat("/data.bin")
            n = 0
            async for piece in c.reader(info).stream():
                n += len(piece)
            return n

    def file_api() -> int:
        with Client(url, config=load_config(env={})) as c, c.open("/data.bin") as fh:
            n = 0
            while got := fh.readinto(out[n:n + 8 * MiB]):
                n += got
            return n

    def fsspec_file() -> int:
        # As a pandas or pyarrow user reads: fsspec.filesystem("stager").open().read().
        fs = fsspec.filesystem("stager", meta_url=url, config=load_config(env={}),
                               skip_instance_cache=True)
        try:
            return B.open_read(fs, "/data.bin")
        finally:
            fs.close()

    return {
        HEADLINE: lambda: _rate(lambda: run_async(read_into(url))),
        BEFORE: lambda: _rate(lambda: run_async(read_into(url, raw=False))),
        "stager stream, readahead": lambda: _rate(lambda: run_async(stream())),
        "stager Client.open().readinto 8 MiB": lambda: _rate(file_api),
        STAGER_FSSPEC: lambda: _rate(fsspec_file),
        UVLOOP: lambda: _rate(lambda: run_async(read_into(uv_url))),
    }


def _rate(fn: Any) -> tuple[float, float]:
    """(MB/s, this process's CPU seconds per GB) of a reader returning its byte count."""
    cpu = time.process_time()
    seconds, n = timed(fn)
    return rate(n, seconds), (time.process_time() - cpu) / (n / 1e9)


def _sockets(size: int, out: memoryview) -> tuple[float, float]:
    cpu = time.process_time()
    per_s = B.socket_pair_rate(size, out)
    return per_s / 1e6, (time.process_time() - cpu) / (size / 1e9)


def run(quick: bool) -> dict[str, Any]:
    size = 64 * MiB if quick else 1 * GiB
    rounds = 1 if quick else 5
    with scratch("loopback") as tmp:
        local = write_local(tmp / "www" / "data.bin", size)
        buf = bytearray(size)
        out = memoryview(buf)
        with NodeCluster(tmp / "asyncio", DATA_SERVERS, mode="loopback") as plain, \
                NodeCluster(tmp / "uvloop", DATA_SERVERS, mode="loopback",
                            env={"STAGER_EVENT_LOOP": "uvloop"}) as uv, \
                contextlib.ExitStack() as stack:
            for cluster in (plain, uv):
                run_async(_upload(cluster.meta_url, local))
            cases: dict[str, Any] = {
                **_stager_cases(plain.meta_url, uv.meta_url, out),
                PAGE_CACHE: lambda: _rate(lambda: B.page_cache_read(local, out)),
                SOCKETS: lambda: _sockets(size, out),
            }
            if shutil.which("iperf3"):
                cases[IPERF] = lambda: ((B.iperf3_rate(1 if quick else 2) or nan) / 1e6,
                                        nan)
            if not B.nginx_missing():
                nginx = stack.enter_context(B.Nginx(tmp / "www", tmp / "nginx"))
                url = f"{nginx.url}/data.bin"
                cases[FSSPEC_CAT] = lambda: _rate(lambda: B.fsspec_cat(url))
                cases[FSSPEC_SEQ] = lambda: _rate(lambda: B.fsspec_sequential(url))
                cases[RANGED] = lambda: _rate(
                    lambda: run_async(B.aiohttp_ranged(url, size, out)))
            for case in cases.values():   # warm the page cache and the connections
                case()
            figures = interleaved(rounds, cases)
    return _result(figures, size, rounds, quick)


async def _upload(meta_url: str, local: Path) -> None:
    async with new_client(meta_url) as c:
        await upload_file(c, local, "/data.bin")


def _result(figures: dict[str, list[tuple[float, float]]], size: int, rounds: int,
            quick: bool) -> dict[str, Any]:
    failed = [k for k, v in figures.items() if any(r != r for r, _ in v)]   # NaN: no figure
    figures = {k: v for k, v in figures.items() if k not in failed}
    med = {k: median([r for r, _ in v]) for k, v in figures.items()}
    cpu = {k: median([c for _, c in v]) for k, v in figures.items()}
    head = med[HEADLINE]
    tcp_name = IPERF if IPERF in med else SOCKETS
    rows = [[name, r2(value), r2(value / head), r2(cpu[name]) if cpu[name] == cpu[name]
             else None, " / ".join(f"{r:.0f}" for r, _ in figures[name])]
            for name, value in sorted(med.items(), key=lambda kv: -kv[1])]
    ratios = {
        "stager / before rawhttp (aiohttp reads)": r2(head / med[BEFORE]),
        "client CPU per GB, before rawhttp / now": r2(cpu[BEFORE] / cpu[HEADLINE]),
        f"stager / {tcp_name}": r2(head / med[tcp_name]),
        "stager / page cache read": r2(head / med[PAGE_CACHE]),
        "data servers on uvloop / on asyncio": r2(med[UVLOOP] / head),
    }
    aims = {f"stager / {tcp_name}": aim(head / med[tcp_name], ">= 0.5",
                                        head >= 0.5 * med[tcp_name])}
    notes = [
        f"{size // MiB} MiB file, {DATA_SERVERS} data servers on 127.0.0.1, default client "
        f"settings; median of {rounds} interleaved rounds after a warm-up round.",
        "'stager' in the ratios is the parallel read_into (every chunk at once, 16 in "
        "flight, into one preallocated buffer) with the data servers on the stock asyncio "
        "loop (their default: zero-copy sendfile).",
        "'reader CPU s/GB' is the CPU time of the reading process (all its threads) per "
        "GB read: servers, nginx and the iperf3/socket senders are not in it. It is the "
        "steadier figure when other work shares the machine.",
        "All processes share this machine's cores: client, servers and baselines compete "
        "for them, so the figures are noisy; the ratios come from the same run.",
    ]
    if failed:
        notes.append(f"No figure this run (the tool failed in a round): {', '.join(failed)}.")
    if FSSPEC_CAT in med:
        fsspec = max(med[FSSPEC_CAT], med[FSSPEC_SEQ])
        ratios["stager / best nginx+fsspec"] = r2(head / fsspec)
        ratios["stager / nginx+aiohttp ranged"] = r2(head / med[RANGED])
        aims["stager / nginx+fsspec"] = aim(head / fsspec, ">= 1.5", head >= 1.5 * fsspec)
        both = med[STAGER_FSSPEC] / med[FSSPEC_SEQ]
        ratios[f"{STAGER_FSSPEC} / {FSSPEC_SEQ}"] = r2(both)
        aims["stager fsspec open/read / nginx+fsspec open/read"] = aim(both, ">= 2",
                                                                        both >= 2)
        notes.append("'best nginx+fsspec' is the faster of fsspec's two modes.")
        notes.append("'open/read 8 MiB' reads the file front to back as a pandas or pyarrow "
                     "user does, fsspec.filesystem(...).open(path).read(8 MiB) until the "
                     "end, through stager's filesystem and through fsspec's HTTP filesystem "
                     "from nginx: the same code on both sides, each with its defaults.")
    else:
        notes.append(f"nginx baselines skipped: {B.nginx_missing()}")
    return {
        "title": "Loopback ceiling: reading one file, warm page cache",
        "command": "python -m bench loopback" + (" --quick" if quick else ""),
        "columns": ["reader", "MB/s (median)", "x stager read_into",
                    "reader CPU s/GB (this process)", "MB/s per round"],
        "rows": rows, "ratios": ratios, "aims": aims, "notes": notes,
        "plot": {"kind": "barh", "x": "reader", "y": ["MB/s (median)"], "ylabel": "MB/s"},
    }
