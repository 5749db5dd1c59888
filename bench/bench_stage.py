"""Staging: a few large files and many small ones, from a local directory and from an
HTTP server on loopback, into three data servers, against ``cp -r`` of the same
tree and fsspec ``get`` from the same HTTP server, in one run.

The "source's own read rate" is fsspec ``get`` of the tree from the HTTP server
to a local directory (the same files, the same server, fsspec's default
concurrency).  Every source file sits in the page cache; stager's chunks are
durable (fsync, rename, fsync of the directory) before they count, ``cp -r`` and
``get`` write to the page cache only.  The last small-file row is the disk's own
durable-create rate (16 KiB file, fsync, rename, fsync of the directory, 16
threads): what each staged small file costs the data servers at least.  The
rows after it are the metadata server alone: a create and a commit per empty
file, 64 in flight (timed on ``META_ONLY_FILES`` files and scaled to the tree),
and the same files in batches of 512 (``write_many``: one batched create and one
batched commit request per batch, as staging sends small files).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec

from stager import stage as staging
from stager.testing.cluster import ProcessCluster
from stager.testing.httpserver import HttpServer
from stager.testing.netns import NetnsFabric, netns_unavailable

from . import baselines as B
from .common import KiB, MiB, aim, median, new_client, r2, rate, scratch, write_local

DATA_SERVERS = 3
SMALL = 16 * KiB
META_ONLY_FILES = 2_000
CAPS_MBIT = (800, 2000)     # link caps of the source whose read rate is the bottleneck
NGINX_GET = "nginx source: fsspec get (http to local)"
NGINX_STAGE = "nginx source: stager stage http://"


def _make_trees(root: Path, quick: bool) -> dict[str, tuple[Path, int, int]]:
    """``name → (dir, files, bytes)`` for the large and the small tree."""
    large_files, large_size = (4, 4 * MiB) if quick else (4, 256 * MiB)
    small_files = 200 if quick else 20_000
    large = root / "large"
    for i in range(large_files):
        write_local(large / f"part-{i}.bin", large_size, seed=i)
    small = root / "small"
    block = os.urandom(SMALL)
    for i in range(small_files):
        d = small / f"d{i % 20:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"s{i:06d}.bin").write_bytes(block[i % 97:] + block[:i % 97])
    return {"large": (large, large_files, large_files * large_size),
            "small": (small, small_files, small_files * SMALL)}


def cp_r(src: Path, dst: Path) -> float:
    start = time.perf_counter()
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    seconds = time.perf_counter() - start
    shutil.rmtree(dst)
    return seconds


def fsspec_get(url: str, dst: Path) -> float:
    """fsspec ``get`` of every file below ``url`` (listing included in the time)."""
    start = time.perf_counter()
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    files = fs.find(url + "/")
    fs.get(files, [str(dst / f[len(url) + 1:]) for f in files])
    seconds = time.perf_counter() - start
    shutil.rmtree(dst)
    return seconds


async def _stage(meta_url: str, src: str, dst: str, **options: Any) -> tuple[float, int]:
    async with new_client(meta_url) as client:
        start = time.perf_counter()
        report = await staging.stage(client, src, dst, **options)
        seconds = time.perf_counter() - start
        return seconds, report.copied


async def _drop(meta_url: str, path: str) -> None:
    async with new_client(meta_url) as client:
        await client.rm(path, recursive=True)


def stage(meta_url: str, src: str, dst: str, **options: Any) -> tuple[float, int]:
    return asyncio.run(_stage(meta_url, src, dst, **options))


async def _meta_only(meta_url: str, files: int, in_flight: int = 64) -> float:
    """Seconds for ``files`` empty files: one create and one commit each, nothing else."""
    async with new_client(meta_url) as client:
        limit = asyncio.Semaphore(in_flight)

        async def one(i: int) -> None:
            async with limit:
                file_id, writer = await client.create(f"/bench-meta/d{i % 20:02d}/{i}")
                await client.commit(file_id, writer)

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(files)))
        seconds = time.perf_counter() - start
        await client.rm("/bench-meta", recursive=True)
        return seconds


async def _meta_batched(meta_url: str, files: int, batch: int = 512) -> float:
    """Seconds for ``files`` empty files written ``batch`` at a time with write_many:
    a batched create and a batched commit request per batch, as staging sends them."""
    async with new_client(meta_url) as client:
        start = time.perf_counter()
        for k in range(0, files, batch):
            results = await client.write_many([(f"/bench-meta-b/d{i % 20:02d}/{i}", b"")
                                               for i in range(k, min(files, k + batch))])
            assert not any(isinstance(r, Exception) for r in results), results
        seconds = time.perf_counter() - start
        await client.rm("/bench-meta-b", recursive=True)
        return seconds


def durable_creates(directory: Path, files: int) -> float:
    """The disk's own rate for small durable files, as a data server writes a chunk."""
    directory.mkdir(parents=True)
    data = os.urandom(SMALL)

    def one(i: int) -> None:
        tmp, final = directory / f".{i}.tmp", directory / f"{i}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
        os.replace(tmp, final)
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(dfd)
        os.close(dfd)

    start = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(files)))
    seconds = time.perf_counter() - start
    shutil.rmtree(directory)
    return seconds


def _measure(tree: str, src: Path, files: int, http_url: str, meta_url: str, tmp: Path,
             rounds: int) -> dict[str, list[float]]:
    """Every case once per round, in turn; then a rerun onto the last staged copy."""
    kept: list[str] = []

    def staged(source: str, k: int) -> float:
        dst = f"/bench-{tree}-{len(kept)}-{k}"
        seconds, copied = stage(meta_url, source, dst)
        assert copied == files, (copied, files)
        kept.append(dst)
        return seconds

    cases = {
        "cp -r (local to local)": lambda k: cp_r(src, tmp / "cp-copy"),
        "fsspec get (http to local)": lambda k: fsspec_get(http_url, tmp / "get-copy"),
        "stager stage file://": lambda k: staged(f"file://{src}", k),
        "stager stage http://": lambda k: staged(http_url + "/", k),
    }
    out: dict[str, list[float]] = {name: [] for name in cases}
    for k in range(rounds):
        for name, case in cases.items():
            out[name].append(case(k))
        for dst in kept[:-1]:                 # keep the disk from filling over rounds
            asyncio.run(_drop(meta_url, dst))
        del kept[:-1]
    seconds, copied = stage(meta_url, http_url + "/", kept[-1])
    assert copied == 0, copied                # every file already staged unchanged
    out["stager stage http://, rerun (all unchanged)"] = [seconds]
    asyncio.run(_drop(meta_url, kept[-1]))
    return out


def capped_names(cap_mbit: int) -> tuple[str, str]:
    """The row names (fsspec get, stager stage) for a source capped at ``cap_mbit``."""
    where = f"source capped at {cap_mbit} Mbit/s"
    return (f"{where}: fsspec get (the source's read rate)",
            f"{where}: stager stage http://")


def _capped(src_root: Path, files: int, meta_url: str, tmp: Path,
            rounds: int) -> tuple[dict[str, list[float]], str | None]:
    """The large tree from an HTTP source whose read rate is the bottleneck: the same
    server, inside a network namespace whose link is capped (tc tbf, both ways), read
    by fsspec get and staged by stager in interleaved rounds, for each cap.
    ``({}, why)`` where namespaces cannot be made here."""
    why = netns_unavailable()
    if why:
        return {}, why
    out: dict[str, list[float]] = {}
    with NetnsFabric(1, rate_mbit=CAPS_MBIT[0]) as fabric, HttpServer(
            src_root, host=fabric.nodes[0].address, prefix=fabric.netns_argv(0, [])) as http:
        url = f"{http.url}/large"
        for cap in CAPS_MBIT:
            fabric.set_rate(cap)
            get, staged = capped_names(cap)
            out[get], out[staged] = [], []
            for k in range(rounds):
                out[get].append(fsspec_get(url, tmp / "get-capped"))
                dst = f"/bench-capped-{cap}-{k}"
                seconds, copied = stage(meta_url, url + "/", dst)
                assert copied == files, (copied, files)
                out[staged].append(seconds)
                asyncio.run(_drop(meta_url, dst))
    return out, None


def _nginx_source(src_root: Path, files: int, meta_url: str, tmp: Path
                  ) -> tuple[dict[str, list[float]], str | None]:
    """The small tree from nginx (one worker, autoindex pages) instead of the aiohttp
    source server: fsspec get and stager stage of it, in turn.  ``({}, why)`` without
    nginx."""
    why = B.nginx_missing()
    if why:
        return {}, why
    with B.Nginx(src_root, tmp / "nginx", workers="1", autoindex=True) as nginx:
        url = f"{nginx.url}/small"
        get = fsspec_get(url, tmp / "get-nginx")
        seconds, copied = stage(meta_url, url + "/", "/bench-small-nginx")
        assert copied == files, (copied, files)
        asyncio.run(_drop(meta_url, "/bench-small-nginx"))
    return {NGINX_GET: [get], NGINX_STAGE: [seconds]}, None


def _small_extras(files: int, meta_url: str, tmp: Path) -> dict[str, list[float]]:
    """The disk's and the metadata server's own rates for as many small files."""
    n = min(files, META_ONLY_FILES)    # the same rate, from fewer files
    return {
        "disk: durable 16 KiB creates, 16 threads": [durable_creates(tmp / "durable", files)],
        "metadata server alone: create + commit": [
            asyncio.run(_meta_only(meta_url, n)) * files / n],
        "metadata server alone: batches of 512 (write_many)": [
            asyncio.run(_meta_batched(meta_url, files))],
    }


def run(quick: bool) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    rows: list[list[Any]] = []
    med: dict[tuple[str, str], float] = {}
    capped_skipped: str | None = None
    nginx_skipped: str | None = None
    with scratch("stage") as tmp:
        trees = _make_trees(tmp / "src", quick)
        os.sync()       # the new trees' writeback must not compete with the timed runs
        with HttpServer(tmp / "src") as http, ProcessCluster(tmp / "cluster",
                                                             DATA_SERVERS) as cluster:
            for tree, (src, files, nbytes) in trees.items():
                rounds = 2 if tree == "large" and not quick else 1
                http_url = f"{http.url}/{tree}"
                # warm-up: connections, directories, page cache of the source
                stage(cluster.meta_url, http_url + "/", f"/warm-{tree}", include=["d00/*"]
                      if tree == "small" else ["part-0.bin"])
                asyncio.run(_drop(cluster.meta_url, f"/warm-{tree}"))
                figures = _measure(tree, src, files, http_url, cluster.meta_url, tmp, rounds)
                if tree == "small":
                    figures.update(_small_extras(files, cluster.meta_url, tmp))
                    nginx, nginx_skipped = _nginx_source(tmp / "src", files,
                                                         cluster.meta_url, tmp)
                    figures.update(nginx)
                else:
                    capped, capped_skipped = _capped(tmp / "src", files, cluster.meta_url,
                                                     tmp, rounds)
                    figures.update(capped)
                for name, values in figures.items():
                    secs = median(values)
                    med[(tree, name)] = secs
                    moved = 0 if name.startswith("metadata server") else nbytes  # empty files
                    rows.append([f"{tree}: {name}", files, r2(moved / 1e6), r2(secs),
                                 r2(rate(moved, secs)), r2(files / secs)])
    return _result(rows, med, trees, quick, load_before, os.getloadavg()[0], capped_skipped,
                   nginx_skipped)


def _capped_result(med: dict[tuple[str, str], float], nbytes: int, skipped: str | None
                   ) -> tuple[dict[str, float], dict[str, Any], list[str]]:
    """Ratios, aims and notes of the capped-source rows (or why they are missing)."""
    if skipped is not None:
        return {}, {}, [f"Rows with a capped source skipped: {skipped} (they need network "
                        "namespaces: root and iproute2)."]
    ratios: dict[str, float] = {}
    aims: dict[str, Any] = {}
    for cap in CAPS_MBIT:
        get, staged = (med[("large", n)] for n in capped_names(cap))
        ratio = get / staged
        ratios[f"large, source capped at {cap} Mbit/s: stage / fsspec get"] = r2(ratio)
        ratios[f"large, source capped at {cap} Mbit/s: fsspec get / link cap"] = r2(
            rate(nbytes, get) / (cap / 8))
        aims[f"large files vs the source's read rate, source capped at {cap} Mbit/s"] = aim(
            ratio, ">= 0.8", ratio >= 0.8)
    caps = " and ".join(f"{c} Mbit/s ({c / 8:g} MB/s)" for c in CAPS_MBIT)
    return ratios, aims, [
        f"Capped rows: the same HTTP source server, run inside a network namespace "
        f"(stager.testing.netns) whose veth link is capped with tc tbf at {caps}, both "
        "ways; fsspec get (the source's own read rate) and stager stage read it over that "
        "link in interleaved rounds, while the data servers stay on loopback, uncapped.  "
        "Here the source's link bounds both, as it does when the dataset lives on another "
        "machine, and the aim compares stage with fsspec get of the same capped source "
        "(tbf counts IP bytes, so payload tops out a few % under the cap)."]


def _nginx_result(per_s: Callable[[str, str], float], skipped: str | None
                  ) -> tuple[dict[str, float], dict[str, Any], list[str]]:
    """Ratios, aim and note of the small tree staged from nginx (or why it is missing)."""
    if skipped is not None:
        return {}, {}, [f"Rows with an nginx source skipped: {skipped}."]
    staged = per_s("small", NGINX_STAGE)
    return ({"small, nginx source: stage http / fsspec get http (files/s)": r2(
                staged / per_s("small", NGINX_GET))},
            {"small files per second (http, nginx source)": aim(
                staged, ">= 2000 files/s", staged >= 2000)},
            ["nginx source rows: the same small tree served by nginx (one worker process, "
             "autoindex directory pages, sendfile, ETags, byte ranges) instead of the "
             "aiohttp source server, which is Python and, at about 0.3 ms of CPU per "
             "request, is itself a large share of the small-file runs above.  A dataset's "
             "real HTTP host is more like nginx; both sources are shown, each with "
             "fsspec get of the same server beside it."])


def _result(rows: list[list[Any]], med: dict[tuple[str, str], float],
            trees: dict[str, tuple[Path, int, int]], quick: bool, load_before: float,
            load_after: float, capped_skipped: str | None,
            nginx_skipped: str | None) -> dict[str, Any]:
    def speed(tree: str, name: str) -> float:
        return trees[tree][2] / med[(tree, name)]

    def per_s(tree: str, name: str) -> float:
        return trees[tree][1] / med[(tree, name)]

    large_vs_source = speed("large", "stager stage http://") / speed(
        "large", "fsspec get (http to local)")
    small_rate = per_s("small", "stager stage http://")
    large, small = trees["large"], trees["small"]
    capped_ratios, capped_aims, capped_notes = _capped_result(med, large[2], capped_skipped)
    nginx_ratios, nginx_aims, nginx_notes = _nginx_result(per_s, nginx_skipped)
    return {
        "title": "Staging: large and small files, from a directory and from HTTP",
        "command": "python -m bench stage" + (" --quick" if quick else ""),
        "columns": ["tree: method", "files", "MB", "seconds", "MB/s", "files/s"],
        "rows": rows,
        "ratios": {
            "large: stage http / fsspec get http (uncapped loopback source)": r2(
                large_vs_source),
            **capped_ratios,
            "large: stage file / cp -r": r2(speed("large", "stager stage file://")
                                            / speed("large", "cp -r (local to local)")),
            "small: stage http / fsspec get http (files/s)": r2(
                small_rate / per_s("small", "fsspec get (http to local)")),
            "small: stage file / cp -r (files/s)": r2(
                per_s("small", "stager stage file://") / per_s("small", "cp -r (local to local)")),
            "small: stage http / disk durable creates (files/s)": r2(
                small_rate / per_s("small", "disk: durable 16 KiB creates, 16 threads")),
            "small: stage http / metadata create+commit alone (files/s)": r2(
                small_rate / per_s("small", "metadata server alone: create + commit")),
            **nginx_ratios,
        },
        "aims": {
            "large files vs the source's read rate, uncapped loopback source": aim(
                large_vs_source, ">= 0.8", large_vs_source >= 0.8),
            **capped_aims,
            "small files per second (http)": aim(small_rate, ">= 2000 files/s",
                                                 small_rate >= 2000),
            **nginx_aims,
        },
        "notes": [
            f"large: {large[1]} files, {large[2] // large[1] // MiB} MiB each; small: "
            f"{small[1]} files of {SMALL // KiB} KiB in 20 directories.  {DATA_SERVERS} data "
            "servers and the metadata server as processes (stager up), the HTTP source an "
            "aiohttp server (sendfile, byte ranges) in its own process, all on this "
            "machine and its one disk.",
            "stager stage: default options (64 small files in flight; 4 large files, each "
            "with 8 ranged reads of 4 MiB in flight; 4 MiB chunks, 1 replica); times include "
            "listing, the resume check and recording the manifest.  Large-file figures are "
            "the median of 2 interleaved rounds (1 in quick mode), small files 1 round.",
            "What bounds the uncapped large-file rows: the source is a page-cached server "
            "on loopback, faster than this machine's durable write path, so stager stage is "
            "bounded by CPU (2 cores shared by the client, the source server and 3 data "
            "servers; most of it the data servers' kernel time receiving, writing and "
            "fsyncing each chunk) while fsspec get and cp -r only copy into the page cache.  "
            "Their ratio measures this machine, not the source; the capped rows measure "
            "the aim where the source is the bottleneck.",
            *capped_notes,
            *nginx_notes,
            "Every staged file costs a create and a commit on the metadata server (SQLite, "
            "fsync; one transaction for a whole batch of small files) and a durable chunk "
            "write (fsync, rename, fsync of the directory) on a data server; cp -r and "
            "fsspec get write to the page cache only.",
            "Small files go in batches (stager/client/transfer/small.py): groups of up to "
            "512 files, 3 in flight, each one batched create and one batched commit request (one "
            "transaction, one fsync each) and one chunk batch (POST /v1/write) per data "
            "server, whose chunks are written and fsynced concurrently, each durable "
            "before the answer.  Groups are written while the rest of the source is "
            "still being listed (stager/stage/feed.py).",
            "An HTTP directory page has no sizes.  stager stage http:// sizes each file "
            "with one raw ranged GET of its first 256 KiB (stager/sources/httpraw.py), "
            "which for a small file is the whole file: one source request per file, as "
            "for fsspec get (it cost a HEAD and a GET before).  The rerun asks each file "
            "for one byte, conditionally on the ETag the manifest recorded (If-None-Match"
            "): the server answers 304 without opening the file.",
            "What bounds small files now is CPU: every file costs a chunk file created, "
            "fsynced and renamed on a data server (with a new fan-out directory for most "
            "files on a fresh target), a GET answered by the source server (about as much "
            "CPU as the data server's write on this machine), and the client's and "
            "servers' Python, all on this machine's shared cores; stage http:// costs "
            "what stage file:// does plus the source server's GETs (measure the split "
            "with python -m bench.profile_small stage --sources http,get,file,rerun).  A "
            "large file's bytes are received from the source, checksummed, sent to a data "
            "server, checksummed again and fsynced there, while fsspec get and cp -r only "
            "copy into the page cache.",
            f"Load average (1 min) before and after: {load_before:.1f}, {load_after:.1f} on "
            f"{os.cpu_count()} cores (other work on the machine shares them).",
        ],
        "plot": {"kind": "barh", "x": "tree: method", "y": ["MB/s"], "ylabel": "MB/s"},
    }
