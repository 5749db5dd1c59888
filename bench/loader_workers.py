"""Rows of the loader benchmark for ``StagerDataLoader`` worker counts and for the
plain stall of a fresh Loader's first epoch.

* ``num_workers`` 0, 1 and 2 over the loader benchmark's 16 KiB tar shards: the
  samples/s of an epoch after its first batch, in rounds (every count once per
  round, the start rotating), so the counts compared are measured in the same
  minutes.  1 and 2 as a user gets them (``fallback`` on: on too few cores,
  :func:`~stager.loader.workers.workers_pay`, they read in the main process, and
  the row says so: ``in_process``), and forked anyway (``fallback=False``, rows
  ``1 forked`` and ``2 forked``), so the workers' own rate stays measured;
* the plain stall (as :mod:`bench.plain_stall`) of a *fresh* Loader's first
  epoch, paced at 80 % of the rate of a no-compute epoch, and of its next epoch.

``python -m bench.loader_workers [--quick]`` prints the figures as JSON.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from stager import Client, Loader
from stager.loader.workers import usable_cores
from stager.testing.nodes import NodeCluster

from . import plain_stall
from .common import scratch
from .training_loop import drive

BATCH = 256
#: row -> (num_workers, fallback)
WORKERS = {"0": (0, True), "1": (1, True), "2": (2, True),
           "1 forked": (1, False), "2 forked": (2, False)}


def samples(quick: bool) -> int:
    return 4_096 if quick else 65_536     # --quick: 16 batches an epoch, 8 epochs


def _rounds(quick: bool) -> int:
    return 1 if quick else 3


def workers_rates(meta: str, path: str, index: Path, rounds: int
                  ) -> tuple[dict[str, list[float]], dict[str, bool]]:
    """samples/s of one epoch per row of :data:`WORKERS` and round (after the first
    batch), and whether each row read in the main process (the fallback)."""
    from stager.torch import StagerDataLoader, StagerDataset

    rows = list(WORKERS)
    rates: dict[str, list[float]] = {w: [] for w in rows}
    in_process: dict[str, bool] = {}
    for r in range(rounds):
        for row in rows[r % len(rows):] + rows[:r % len(rows)]:
            w, fallback = WORKERS[row]
            ds = StagerDataset(path, meta_url=meta, batch_size=BATCH, seed=r,
                               index_cache=index, **plain_stall.LOADER)
            try:
                dl = StagerDataLoader(ds, num_workers=w, fallback=fallback,
                                      multiprocessing_context="fork" if w else None)
                in_process[row] = dl.in_process
                rates[row].append(drive(lambda dl=dl: dl, len, 0.0, 1 << 30)["rate"])
            finally:
                ds.close()
    return rates, in_process


def first_epoch_stall(meta: str, path: str, index: Path, rounds: int) -> dict[str, Any]:
    """Per round: R from a fresh Loader's no-compute epoch 0; then another fresh
    Loader paced at 80 % of R for epoch 0 (the first) and epoch 1 (a later one)."""
    first: list[float] = []
    later: list[float] = []
    ttfb: list[float] = []
    for r in range(rounds):
        with Loader(path, meta_url=meta, batch_size=BATCH, seed=r, index_cache=index,
                    **plain_stall.LOADER) as loader:
            rate = drive(lambda loader=loader: loader, len, 0.0, 1 << 30)["rate"]
        step = BATCH / (0.8 * rate)
        with Loader(path, meta_url=meta, batch_size=BATCH, seed=r, index_cache=index,
                    **plain_stall.LOADER) as loader:
            got = drive(lambda loader=loader: loader, len, step, 1 << 30)
            first.append(got["stall"])
            ttfb.append(got["ttfb"])
            later.append(drive(lambda loader=loader: loader, len, step, 1 << 30)["stall"])
    return {"first": first, "later": later, "ttfb_paced": ttfb}


def measure(tmp: Path, quick: bool) -> dict[str, Any]:
    n = samples(quick)
    shards = tmp / "workers-www"
    shards.mkdir(parents=True)
    plain_stall.write_shards(shards / "tar", n)
    with NodeCluster(tmp / "workers-cluster", plain_stall.DATA_SERVERS,
                     mode="loopback") as cluster:
        with Client(cluster.meta_url) as c:
            c.put(shards / "tar", "/w", files_in_flight=8)
        index = tmp / "workers-index"
        rates, in_process = workers_rates(cluster.meta_url, "/w", index, _rounds(quick))
        stall = first_epoch_stall(cluster.meta_url, "/w", index, _rounds(quick))
    return {"samples": n,
            "cores": usable_cores(),
            "workers": {w: {"rate": statistics.median(v), "rates": v,
                            "in_process": in_process[w]} for w, v in rates.items()},
            "stall_first": statistics.median(stall["first"]),
            "stall_later": statistics.median(stall["later"]),
            **stall}


if __name__ == "__main__":
    with scratch("loader-workers") as tmp:
        print(json.dumps(measure(tmp, "--quick" in sys.argv), indent=1))
