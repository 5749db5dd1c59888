"""A per-job cluster (``stager job up``) on 3 emulated nodes: start-to-ready, and
stage-in from the shared tier against ``cp -r`` into every node's directory.

BeeOND's comparison: a job that wants its dataset on node-local disks either
copies it to every node (``srun cp -r``, here three ``cp -r`` at once, one per
node) or starts a per-job file system over those disks and copies it in once,
in parallel from all nodes (``beeond-cp``; here ``stager job up --stage-in``,
every node taking every third file of the sorted listing).

Each node is a network namespace with its own address
(:class:`~stager.testing.jobnodes.EmulatedJob`; without root, loopback), its
links uncapped; every "node-local disk" and the "shared tier" are directories
on this machine's one file system, so the figures show the orchestration's
cost and the copy's CPU cost, not a parallel file system's bandwidth.  Each
round is a fresh job: ``job up`` with the stage-in on all nodes (like one
``srun`` step), then ``job down``; then the ``cp -r`` of the same directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from stager.testing.jobnodes import EmulatedJob

from .common import GiB, MiB, median, r2, rate, scratch

NODES = 3


def make_dataset(root: Path, files: int, total: int) -> int:
    """``files`` files of ``total // files`` bytes (random, so nothing compresses)."""
    size = total // files
    block = os.urandom(size)
    for i in range(files):
        path = root / f"shard{i % 10:02d}" / f"sample{i:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        # a distinct head per file: no two files are the same bytes
        path.write_bytes(i.to_bytes(8, "little") + block[8:])
    return size * files


def job_round(tmp: Path, src: Path, job_id: str) -> dict[str, float]:
    """One job: up with stage-in on every node, timed; then down."""
    with EmulatedJob(tmp / f"job{job_id}", NODES, job_id=job_id) as job:
        start = time.perf_counter()
        job.step(["job", "up", "--stage-in", str(src), "/dataset", "--quiet"])
        wall = time.perf_counter() - start
        cluster = job.cluster()
        staged = cluster["stage_in"][0]
        if staged["files"] != sum(1 for p in src.rglob("*") if p.is_file()):
            raise RuntimeError(f"staged {staged['files']} files, not all of {src}")
        job.step(["job", "down", "--quiet"])
        if job.leftovers() != ([], []):
            raise RuntimeError(f"job down left {job.leftovers()}")
        return {"ready": cluster["ready_seconds"],
                "stage": cluster["up_seconds"] - cluster["ready_seconds"],
                "wall": wall, "mode": 1.0 if job.mode == "netns" else 0.0}


def cp_round(tmp: Path, src: Path) -> float:
    """``cp -r`` of ``src`` into each node's directory, the three at once."""
    dests = [tmp / f"cp-node{i}" for i in range(NODES)]
    start = time.perf_counter()
    procs = [subprocess.Popen(["cp", "-r", str(src), str(d)]) for d in dests]
    if any(p.wait() for p in procs):
        raise RuntimeError("cp -r failed")
    seconds = time.perf_counter() - start
    for d in dests:
        shutil.rmtree(d)
    return seconds


def run(quick: bool) -> dict[str, Any]:
    files, total = (100, 32 * MiB) if quick else (1000, 1 * GiB)
    rounds = 1 if quick else 3
    with scratch("jobcluster") as tmp:
        src = tmp / "shared" / "dataset"
        size = make_dataset(src, files, total)
        jobs, cps = [], []
        for r in range(rounds):
            jobs.append(job_round(tmp, src, str(100 + r)))
            cps.append(cp_round(tmp, src))
    where = "network namespaces with their own addresses" if all(j["mode"] for j in jobs) \
        else "loopback (no root: no namespaces)"
    ready = [j["ready"] for j in jobs]
    stage = [j["stage"] for j in jobs]
    walls = [j["wall"] for j in jobs]

    def row(name: str, seconds: list[float], nbytes: int | None) -> list[Any]:
        mbs = r2(rate(nbytes, median(seconds))) if nbytes else 0.0
        return [name, r2(median(seconds)), mbs, " / ".join(f"{x:.2f}" for x in seconds)]

    rows = [
        row(f"job up: start to ready ({NODES} nodes)", ready, None),
        row(f"job up: stage-in, 1 copy striped over {NODES} nodes", stage, size),
        row("job up: whole srun step (ready + stage-in)", walls, size),
        row(f"cp -r into each of {NODES} node dirs, at once", cps, size * NODES),
    ]
    return {
        "title": "Per-job cluster on 3 emulated nodes: start-to-ready, stage-in vs cp -r",
        "command": "python -m bench jobcluster" + (" --quick" if quick else ""),
        "columns": ["run", "seconds (median)", "MB/s written (median)", "seconds per round"],
        "rows": rows,
        "ratios": {"job up step / cp -r time": r2(median(walls) / median(cps)),
                   "start to ready seconds": r2(median(ready))},
        "notes": [
            f"Dataset: {files} files of {size // files // 1024} KiB ({size / MiB:.0f} MiB) in "
            f"a local directory standing for the shared tier; median of {rounds} round(s), "
            "each a fresh job.",
            f"Nodes: {where}, "
            "links uncapped; every node's disk and the shared tier are one file system of "
            "this machine, and the nodes share its cores.",
            "Start to ready: node 0's `job up` from its start until the metadata server lists "
            "a healthy target on every node (auth on: tokens minted and shared through the "
            "job directory). Stage-in: from ready until node 0 wrote cluster.json (every "
            "node's share copied, then one resuming pass that records the manifest).",
            f"cp -r writes the dataset {NODES} times (a full copy per node); the per-job "
            "cluster writes it once, striped, and every node reads all of it over the "
            "network.",
        ],
        "plot": {"kind": "barh", "x": "run", "y": ["seconds (median)"], "ylabel": "seconds"},
    }
