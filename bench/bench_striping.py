"""Striping scaling: one file striped over N emulated nodes with capped links.

Every node is a network namespace whose link is capped with ``tc tbf`` (see
:mod:`stager.testing.netns`); one data server runs in each.  A file is striped
over N = 1, 2, 4, 8 of them and read by one client in the root namespace
through the readahead stream; efficiency = throughput / (N x cap).  Baseline:
nginx inside one capped node serving the same bytes, read with fsspec's HTTP
filesystem (the single-file-server case).  The data is loaded with the caps
lifted; the caps are on for every read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stager.protocol.models import LayoutSpec
from stager.testing.nodes import NodeCluster

from . import baselines as B
from .common import (
    GiB,
    MiB,
    aim,
    atimed,
    drain,
    new_client,
    r2,
    rate,
    run_async,
    scratch,
    timed,
    upload_file,
    write_local,
)

CAP_MBIT = 200.0


def run(quick: bool) -> dict[str, Any]:
    counts = [1, 2, 4] if quick else [1, 2, 4, 8]
    size = 48 * MiB if quick else 1 * GiB
    with scratch("striping") as tmp:
        local = write_local(tmp / "www" / "data.bin", size)
        with NodeCluster(tmp / "cluster", max(counts), rate_mbit=None) as cluster:
            run_async(_load(cluster.meta_url, local, counts))
            cluster.set_rate(CAP_MBIT)
            figures = run_async(_read_all(cluster.meta_url, counts))
            nginx = _nginx(cluster, tmp, size)
            mode, why = cluster.mode, cluster.why_loopback
    return _result(figures, nginx, size, counts, mode, why, quick)


async def _load(meta_url: str, local: Path, counts: list[int]) -> None:
    async with new_client(meta_url) as c:
        for n in counts:
            await upload_file(c, local, f"/striped-{n}", layout=LayoutSpec(stripe_count=n))


async def _read_all(meta_url: str, counts: list[int]) -> dict[int, float]:
    out = {}
    async with new_client(meta_url) as c:
        for n in counts:
            seconds, nbytes = await atimed(drain(c, f"/striped-{n}"))
            out[n] = rate(nbytes, seconds)
    return out


def _nginx(cluster: NodeCluster, tmp: Path, size: int) -> float | None:
    if B.nginx_missing():
        return None

    def spawn(argv: list[str]) -> Any:
        return cluster.popen_in(0, argv)

    with B.Nginx(tmp / "www", tmp / "nginx", address=cluster.address(0), port=8080,
                 spawn=spawn) as nginx:
        seconds, nbytes = timed(lambda: B.fsspec_cat(f"{nginx.url}/data.bin"))
    assert nbytes == size
    return rate(nbytes, seconds)


def _result(figures: dict[int, float], nginx: float | None, size: int, counts: list[int],
            mode: str, why: str | None, quick: bool) -> dict[str, Any]:
    cap = CAP_MBIT * 1e6 / 8 / 1e6 if mode == "netns" else None   # MB/s per link
    rows: list[list[Any]] = []
    for n in counts:
        ideal = n * cap if cap else None
        rows.append([f"stager, N={n}", n, r2(figures[n]), r2(ideal) if ideal else None,
                     r2(figures[n] / ideal) if ideal else None])
    if nginx is not None:
        rows.append(["nginx + fsspec HTTP, 1 node", 1, r2(nginx), r2(cap) if cap else None,
                     r2(nginx / cap) if cap else None])
    top = max(counts)
    ratios: dict[str, float] = {}
    aims: dict[str, Any] = {}
    if cap:
        eff = figures[top] / (top * cap)
        ratios[f"efficiency at N={top}"] = r2(eff)
        if top == 8:
            aims["efficiency at N=8"] = aim(eff, ">= 0.9", eff >= 0.9)
    if nginx:
        ratios[f"stager N={top} / nginx"] = r2(figures[top] / nginx)
        if top == 8:
            aims["stager N=8 / nginx"] = aim(figures[top] / nginx, ">= 7",
                                             figures[top] >= 7 * nginx)
    notes = [f"{size // MiB} MiB file read once per N by one client (readahead stream, "
             f"default settings); cap {CAP_MBIT:.0f} Mbit/s = {CAP_MBIT / 8:.0f} MB/s per "
             "node link (tc tbf counts IP bytes, so payload tops out a few % lower).",
             "Efficiency = throughput / (N x cap)."]
    if mode != "netns":
        notes.append(f"Loopback-only mode ({why}): no caps, so no efficiency; the rows "
                     "show uncapped loopback rates only.")
    if nginx is None:
        notes.append("nginx baseline skipped: " + (B.nginx_missing() or ""))
    return {
        "title": "Striping scaling over N capped nodes",
        "command": "python -m bench striping" + (" --quick" if quick else ""),
        "columns": ["reader", "nodes", "MB/s", "N x cap MB/s", "efficiency"],
        "rows": rows, "ratios": ratios, "aims": aims, "notes": notes,
        "plot": {"kind": "bar", "x": "reader", "y": ["MB/s", "N x cap MB/s"],
                 "ylabel": "MB/s"},
    }
