"""Loader telemetry reported to the metadata server: ``GET /v1/jobs``, ``stager jobs``,
``/metrics`` gauges, expiry, bad input, and a metadata server that is down or misbehaves
while a real Loader reads a small dataset from a real cluster."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from conftest import raw_http, start_cluster
from loader_data import file_bytes, write_files
from prometheus_client.parser import text_string_to_metric_families
from reliability_util import wait_for

from stager import Client, Loader
from stager.config import load_config
from stager.loader.report import FINAL_TIMEOUT, job_to_report
from stager.meta.jobtable import JOBS
from stager.protocol.jobreport import MAX_REPORT_BYTES
from stager.testing import ThreadCluster
from stager.web.server import start_sites, stop_sites

pytestmark = pytest.mark.slow      # processes: not in make check

N = 40
DATA_BYTES = sum(len(file_bytes(i, 300)) for i in range(N))


@pytest.fixture(scope="module")
def dataset(cluster: ThreadCluster) -> str:
    path = f"/telemetry-{uuid.uuid4().hex[:8]}"
    with Client(cluster.meta_url, config=load_config(env={})) as c:
        write_files(c, path, N, size=300)
    return path


def new_job() -> str:
    return f"job-{uuid.uuid4().hex[:8]}"


def make_loader(meta_url: str, dataset: str, job: str, **kw: Any) -> Loader:
    kw.setdefault("batch_size", 4)
    kw.setdefault("drop_last", False)
    kw.setdefault("prefetch_next_epoch", False)
    kw.setdefault("report_interval", 0.2)
    return Loader(dataset, meta_url=meta_url, job=job, config=load_config(env={}), **kw)


def jobs(url: str) -> dict[str, dict[str, Any]]:
    r = raw_http(url, "GET", "/v1/jobs")
    assert r.status == 200, r.body
    return {j["job"]: j for j in r.json()["jobs"]}


def entry(url: str, job: str, rank: int = 0, worker: int | None = None) -> dict[str, Any] | None:
    found = jobs(url).get(job)
    for e in found["ranks"] if found else []:
        if (e["rank"], e["worker"]) == (rank, worker):
            return e
    return None



def gauges(url: str, job: str) -> dict[str, dict[tuple[str, str], float]]:
    """{metric: {(rank, worker): value}} of the stager_job_* gauges of ``job``."""
    body = raw_http(url, "GET", "/metrics").body.decode()
    out: dict[str, dict[tuple[str, str], float]] = {}
    for family in text_string_to_metric_families(body):
        if family.name.startswith("stager_job_"):
            for s in family.samples:
                if s.labels["job"] == job:
                    out.setdefault(family.name, {})[(s.labels["rank"], s.labels["worker"])] = \
                        s.value
    return out


def stager_cli(*args: str, meta: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
    out = subprocess.run([sys.executable, "-m", "stager", "--meta", meta, *args],
                         capture_output=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout.decode()


def test_reports_show_in_jobs_cli_and_metrics(cluster: ThreadCluster, dataset: str) -> None:
    url, job = cluster.meta_url, new_job()
    with make_loader(url, dataset, job, seed=3, report_interval=0.4) as loader:
        seen = sum(len(batch) for batch in loader)
        assert seen == N
        e = wait_for(lambda: (x := entry(url, job)) and x["samples"] == seen and x,
                     what="a report with every sample")
        stats = loader.stats()
        assert (e["rank"], e["worker"], e["world_size"], e["workers"]) == (0, None, 1, 1)
        assert e["dataset"] == dataset and e["format"] == "files"
        assert e["host"] == socket.gethostname() and e["pid"] == os.getpid()
        assert e["batches"] == 10 and e["dataset_samples"] == N
        assert e["bytes"] == stats["bytes"] >= DATA_BYTES
        assert (e["epoch"], e["cursor"]) == (stats["epoch"], stats["cursor"]) == (1, 0)
        assert 0 < e["time_to_first_batch"] == stats["time_to_first_batch"]
        assert 0 <= e["stall_fraction"] <= 1 and e["samples_per_second"] > 0
        assert e["state"] == "running" and e["final"] is False and e["reports_failed"] == 0
        ids = {cluster.target_id(i) for i in range(3)}
        assert e["targets"] and {t["target"] for t in e["targets"]} <= ids
        assert all(t["mean_latency"] > 0 and t["requests"] > 0 for t in e["targets"])
        latencies = [t["mean_latency"] for t in e["targets"]]
        assert latencies == sorted(latencies, reverse=True)         # worst first
        summary = jobs(url)[job]["summary"]
        assert summary["samples"] == N and summary["state"] == "running"
        assert summary["worst"] == {"rank": 0, "worker": None}
        assert summary["samples_per_second"] == pytest.approx(e["samples_per_second"])

        # the same through the command line, while the loader keeps reporting
        cli = {j["job"]: j for j in json.loads(stager_cli("jobs", "--json", meta=url))}
        assert cli[job]["summary"]["samples"] == N
        assert cli[job]["ranks"][0]["samples"] == N
        text = stager_cli("jobs", "--job", job, meta=url)
        assert job in text and "rank 0" in text and f"{N} samples" in text

        g = gauges(url, job)
        assert g["stager_job_stall_fraction"][("0", "")] == pytest.approx(e["stall_fraction"])
        assert g["stager_job_samples_per_second"][("0", "")] == pytest.approx(
            e["samples_per_second"])
        assert stats["report_job"] == job and stats["reports_sent"] >= 1
        assert stats["reports_failed"] == 0 and stats["report_error"] is None
    # closed: the final report stays until its entry expires (3 intervals: 1.2 s)
    assert entry(url, job)["state"] == "closed"
    wait_for(lambda: entry(url, job) is None, what="the closed entry to expire")
    assert gauges(url, job) == {}


def test_first_and_final_report(cluster: ThreadCluster, dataset: str) -> None:
    """A long interval: one report when reading starts, one on close, none between."""
    url, job = cluster.meta_url, new_job()
    loader = make_loader(url, dataset, job, report_interval=60)
    try:
        it = iter(loader)           # reading (and reporting) starts here
        wait_for(lambda: loader.stats()["reports_sent"] == 1, what="the first report")
        first = entry(url, job)
        assert first is not None and first["samples"] == 0
        assert first["time_to_first_batch"] is None    # visible before its first batch
        seen = sum(len(batch) for batch in it)
        assert entry(url, job)["samples"] == 0          # no report since
    finally:
        loader.close()
    last = entry(url, job)
    assert last is not None and last["state"] == "closed" and last["final"] is True
    assert last["samples"] == seen == N and last["batches"] == 10 and last["seq"] == 2
    assert loader.stats()["reports_sent"] == 2 and loader.stats()["reports_failed"] == 0


def put_report(url: str, path: str, body: object) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return raw_http(url, "PUT", path, body=raw, headers={"Content-Type": "application/json"})


def report(**fields: Any) -> dict[str, Any]:
    return {"interval": 0.2, "world_size": 2, "samples": 10, **fields}


def test_entries_expire_after_missed_reports(cluster: ThreadCluster) -> None:
    url, job = cluster.meta_url, new_job()
    path = f"/v1/jobs/{job}/ranks/1?worker=3"
    r = put_report(url, path, report(stall_fraction=0.25))
    assert r.status == 200 and r.json()["worker"] == 3
    e = entry(url, job, 1, 3)
    assert e is not None and e["stall_fraction"] == 0.25 and e["age"] < 1
    put_report(url, path, report(stall_fraction=0.5))          # a new report: replaced
    start = time.monotonic()
    assert gauges(url, job)["stager_job_stall_fraction"] == {("1", "3"): 0.5}
    wait_for(lambda: job not in jobs(url), what="the entry to expire")
    assert time.monotonic() - start >= 0.9          # lives 3 intervals, at least 1 s
    assert gauges(url, job) == {}


def test_jobs_sorted_worst_first_with_summary(cluster: ThreadCluster) -> None:
    url, fine, starving = cluster.meta_url, new_job(), new_job()
    long = {"interval": 30}
    put_report(url, f"/v1/jobs/{fine}/ranks/0", report(stall_fraction=0.01,
                                                       samples_per_second=900.0, **long))
    for rank, stall, rate in ((0, 0.1, 100.0), (1, 0.6, 50.0)):
        assert put_report(url, f"/v1/jobs/{starving}/ranks/{rank}", report(
            stall_fraction=stall, samples_per_second=rate, session="s1", seq=5,
            **long)).status == 200
    # a report overtaken by a later one of the same loader is ignored
    assert put_report(url, f"/v1/jobs/{starving}/ranks/1", report(
        stall_fraction=0.0, session="s1", seq=4, **long)).status == 200
    listed = [j["job"] for j in raw_http(url, "GET", "/v1/jobs").json()["jobs"]]
    assert listed.index(starving) < listed.index(fine)
    s = jobs(url)[starving]["summary"]
    assert s["worst_stall_fraction"] == 0.6 and s["worst"] == {"rank": 1, "worker": None}
    assert s["samples_per_second"] == 150.0 and s["ranks"] == 2 and s["world_size"] == 2
    assert [e["rank"] for e in jobs(url)[starving]["ranks"]] == [0, 1]
    text = stager_cli("jobs", meta=url)
    assert text.index(starving) < text.index(fine) and "60.0%" in text


BAD_BODIES = [
    (b"{not json", "malformed"),
    (b"[1, 2]", "object"),
    (json.dumps({"interval": 1, "world_size": 1}).encode(), "samples"),
    (json.dumps(report(samples=-1)).encode(), "samples"),
    (json.dumps(report(samples=1.5)).encode(), "samples"),
    (json.dumps(report(samples=True)).encode(), "samples"),
    # refused by the strict JSON parser, before the report's fields are read
    (b'{"interval": 1, "world_size": 2, "samples": 1, "stall_seconds": NaN}', "NaN is not JSON"),
    (json.dumps(report(stall_fraction=1.5)).encode(), "stall_fraction"),
    (json.dumps(report(interval=0)).encode(), "interval"),
    (json.dumps(report(world_size=1)).encode(), "outside world_size"),
    (json.dumps(report(host="h" * 2000)).encode(), "host"),
    (json.dumps(report(final="yes")).encode(), "final"),
    (json.dumps(report(targets=[{"target": f"t{i}"} for i in range(9)])).encode(), "targets"),
    (json.dumps(report(targets=[{"requests": 1}])).encode(), "target"),
]


@pytest.mark.parametrize(("body", "word"), BAD_BODIES)
def test_bad_report_bodies_are_400_json(cluster: ThreadCluster, body: bytes, word: str) -> None:
    job = new_job()
    r = put_report(cluster.meta_url, f"/v1/jobs/{job}/ranks/1", body)
    assert r.status == 400 and r.headers["Content-Type"].startswith("application/json")
    err = r.json()
    assert err["error"] == "bad_request" and word in err["message"], err
    assert job not in jobs(cluster.meta_url)


@pytest.mark.parametrize("path", ["/v1/jobs/-x/ranks/0", "/v1/jobs/a%20b/ranks/0",
                                  "/v1/jobs/j/ranks/x", "/v1/jobs/j/ranks/-1",
                                  "/v1/jobs/j/ranks/0?worker=-2", "/v1/jobs/j/ranks/0?worker=w",
                                  f"/v1/jobs/{'j' * 200}/ranks/0"])
def test_bad_report_urls_are_400_json(cluster: ThreadCluster, path: str) -> None:
    r = put_report(cluster.meta_url, path, report())
    assert r.status == 400 and r.json()["error"] == "bad_request", r.body


def test_a_full_table_is_503_json_and_keeps_what_it_holds(cluster: ThreadCluster) -> None:
    """The table is bounded (its memory); past the bound a new loader's report is
    refused with a JSON 503, while loaders already in the table keep reporting."""
    assert cluster.meta is not None
    table = cluster.meta.app[JOBS]
    limit = table.max_entries
    url, job = cluster.meta_url, new_job()
    table.max_entries = len(table.live()) + 2      # room for two more, this test's
    try:
        for rank in (0, 1):
            assert put_report(url, f"/v1/jobs/{job}/ranks/{rank}", report()).status == 200
        r = put_report(url, f"/v1/jobs/{job}/ranks/1?worker=0", report())
        assert r.status == 503 and r.json()["error"] == "unavailable", r.body
        assert r.json()["details"]["limit"] == table.max_entries
        r = put_report(url, f"/v1/jobs/{job}/ranks/1", report(samples=99))   # an update
        assert r.status == 200
        assert entry(url, job, 1)["samples"] == 99 and entry(url, job, 1, 0) is None
        assert entry(url, job, 0) is not None
    finally:
        table.max_entries = limit


def test_oversized_report_is_413(cluster: ThreadCluster) -> None:
    body = json.dumps(report(padding="x" * MAX_REPORT_BYTES)).encode()
    r = put_report(cluster.meta_url, f"/v1/jobs/{new_job()}/ranks/0", body)
    assert r.status == 413 and r.json()["error"] == "too_large"
    # the limit is the report's own, not the 16 MiB of other JSON bodies
    assert r.json()["details"]["limit"] == MAX_REPORT_BYTES


def test_job_name_comes_from_argument_config_or_scheduler() -> None:
    assert job_to_report(None, None, "", {}) is None              # off by default
    assert job_to_report(None, "a", "", {}) == "a"
    assert job_to_report(None, None, load_config(env={"STAGER_JOB": "b"}).job, {}) == "b"
    assert job_to_report(False, "a", "b", {}) is None
    assert job_to_report(True, None, "", {"SLURM_JOB_ID": "4242"}) == "4242"
    assert job_to_report(True, None, "", {}).endswith(f"-{os.getpid()}")   # HOST-PID
    with pytest.raises(ValueError, match="job name"):
        job_to_report(None, "no spaces", "", {})


def indices(batches: list[list[dict[str, Any]]]) -> list[int]:
    return sorted(int(s["__index__"]) for b in batches for s in b)


def loader_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "stager.loader" and r.levelno >= logging.WARNING]


def test_loader_outlives_its_metadata_server(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """Reads go to the data servers; with the metadata server gone, the loader keeps
    yielding every batch and only counts the reports it cannot deliver."""
    cluster = start_cluster(tmp_path, 2)
    try:
        with Client(cluster.meta_url, config=load_config(env={})) as c:
            write_files(c, "/ds", N, size=300)
        loader = make_loader(cluster.meta_url, "/ds", new_job(), batch_size=2,
                             prefetch_batches=2)
        it = iter(loader)
        got = [next(it)]
        wait_for(lambda: loader.stats()["reports_sent"] >= 1, what="a delivered report")
        cluster.stop_meta()
        for batch in it:            # a slow consumer: several report intervals go by
            got.append(batch)
            time.sleep(0.05)
        assert indices(got) == list(range(N))
        failed = wait_for(lambda: loader.stats()["reports_failed"] >= 2 and
                          loader.stats()["reports_failed"], what="failed reports")
        start = time.monotonic()
        loader.close()              # the final report fails too, quickly
        assert time.monotonic() - start < FINAL_TIMEOUT + 1.5
        stats = loader.stats()
        assert stats["reports_failed"] > failed and stats["samples"] == N
        assert "Unavailable" in stats["report_error"]
        assert len(loader_warnings(caplog)) == 1        # logged once, not per report
    finally:
        cluster.stop()


class Proxy:
    """A real HTTP server in front of the metadata server: it passes every request on,
    except telemetry reports, which it answers as ``mode`` says: ``pass``, ``reject``
    (400), ``error`` (500) or ``hang`` (never within the reporter's timeout)."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.mode, self.url = upstream, "pass", ""
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/v1/jobs/") and self.mode != "pass":
            if self.mode == "hang":
                await asyncio.sleep(3)
            if self.mode == "reject":
                return web.json_response({"error": "bad_request", "message": "no"}, status=400)
            return web.json_response({"error": "internal", "message": "boom"}, status=500)
        assert self.session is not None
        async with self.session.request(request.method, self.upstream + request.path_qs,
                                        data=await request.read(),
                                        headers={"Content-Type": "application/json"}) as r:
            return web.Response(body=await r.read(), status=r.status,
                                content_type="application/json")

    async def _start(self) -> None:
        self.session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        self.sockets = await start_sites(self.runner, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def _stop(self) -> None:
        await stop_sites(self.runner, self.sockets)
        await self.session.close()

    def __enter__(self) -> Proxy:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def test_rejected_failing_and_hanging_reports_are_counted(
        cluster: ThreadCluster, dataset: str, caplog: pytest.LogCaptureFixture) -> None:
    job = new_job()
    caplog.set_level(logging.INFO, logger="stager.loader")
    with Proxy(cluster.meta_url) as proxy:
        loader = make_loader(proxy.url, dataset, job, batch_size=2)
        try:
            it = iter(loader)
            got = []
            for mode, error in (("reject", "BadRequest"), ("error", "InternalError"),
                                ("hang", "TimeoutError")):
                proxy.mode = mode
                failed = loader.stats()["reports_failed"]
                wait_for(lambda f=failed: loader.stats()["reports_failed"] > f, what=mode)
                assert error in loader.stats()["report_error"]
                got.append(next(it))            # batches keep coming meanwhile
            proxy.mode = "pass"
            wait_for(lambda: entry(cluster.meta_url, job), what="a report through")
            got += list(it)
            assert indices(got) == list(range(N))
            e = wait_for(lambda: (x := entry(cluster.meta_url, job)) and x["samples"] == N
                         and x, what="every sample reported")
            assert e["reports_failed"] >= 3
        finally:
            loader.close()
    assert loader.stats()["report_error"] is None           # delivered again
    assert len(loader_warnings(caplog)) == 1
    assert any("again" in r.getMessage() for r in caplog.records if r.name == "stager.loader")
