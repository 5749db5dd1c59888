"""Loader telemetry from PyTorch DataLoader workers: each forked worker reports as its
own (rank, worker) entry, and its final report goes out when the worker's pass ends."""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from loader_data import write_files

from stager import Client
from stager.config import load_config
from stager.testing import ProcessCluster

torch = pytest.importorskip("torch")
from stager.torch import StagerDataLoader, StagerDataset  # noqa: E402

N = 48


@pytest.fixture(scope="module")
def meta_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Servers in processes of their own: DataLoader workers fork this process."""
    cluster = ProcessCluster(tmp_path_factory.mktemp("torch-telemetry"), data_servers=2)
    cluster.start()
    try:
        with Client(cluster.meta_url) as c:
            write_files(c, "/tt/files", N, size=200)
        yield cluster.meta_url
    finally:
        cluster.stop()


def entries(meta_url: str, job: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{meta_url}/v1/jobs", timeout=10) as resp:
        found = [j for j in json.load(resp)["jobs"] if j["job"] == job]
    return found[0]["ranks"] if found else []


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_each_dataloader_worker_reports_its_own_entry(meta_url: str) -> None:
    job = f"torch-{uuid.uuid4().hex[:8]}"
    data = StagerDataset("/tt/files", meta_url=meta_url, batch_size=4, rank=1, world_size=2,
                         drop_last=False, job=job, report_interval=0.2,
                         config=load_config(env={}))
    try:
        # workers even on a machine too small for them to pay (the in-process fallback
        # would read here, and report as rank 1's own entry)
        dl = StagerDataLoader(data, num_workers=2, multiprocessing_context="fork",
                              fallback=False)
        seen = sum(len(batch) for batch in dl)
        assert seen == N // 2                       # rank 1 of 2
        # each worker closed its copy before it told the DataLoader it was done, so its
        # final report is in; the main process read nothing and reports nothing
        got = entries(meta_url, job)
        assert [(e["rank"], e["worker"]) for e in got] == [(1, 0), (1, 1)]
        assert all(e["state"] == "closed" and e["world_size"] == 2 and e["workers"] == 2
                   for e in got)
        pids = {e["pid"] for e in got}
        assert len(pids) == 2 and os.getpid() not in pids
        assert sum(e["samples"] for e in got) == seen
        assert sum(e["batches"] for e in got) == len(dl)
        assert all(e["samples"] > 0 and e["time_to_first_batch"] is not None and
                   e["reports_failed"] == 0 for e in got)
        assert data.loader.stats()["reports_sent"] == 0     # nothing read in this process
    finally:
        data.close()
