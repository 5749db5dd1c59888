"""Loader telemetry with auth on (issue 26): who may report a job, who sees it, and
what metadata servers sharing a store agree on about a job's owner."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from conftest import raw_http, start_cluster
from loader_data import write_files
from reliability_util import wait_for
from test_loader_telemetry import N, indices, loader_warnings, make_loader, new_job

from stager import Client
from stager.config import load_config
from stager.errors import Forbidden
from stager.meta.jobtable import JobTable
from stager.meta.store.sqlite.store import SQLiteStore
from stager.testing import ThreadCluster

pytestmark = pytest.mark.slow      # processes: not in make check


@pytest.fixture(scope="module")
def auth_cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    c = start_cluster(tmp_path_factory.mktemp("telemetry-auth"), 2, auth=True)
    try:
        with Client(c.meta_url, config=load_config(env={}), token=c.admin_token) as admin:
            for team in ("/team-a", "/team-b"):
                write_files(admin, f"{team}/ds", N, size=300)
        yield c
    finally:
        c.stop()


def jobs_as(cluster: ThreadCluster, token: str) -> dict[str, dict[str, Any]]:
    r = raw_http(cluster.meta_url, "GET", "/v1/jobs",
                 headers={"Authorization": f"Bearer {token}"})
    assert r.status == 200, r.body
    return {j["job"]: j for j in r.json()["jobs"]}


@pytest.mark.parametrize("scopes", [["read", "telemetry"], ["read", "write"]])
def test_a_loader_with_the_telemetry_scope_reports(auth_cluster: ThreadCluster,
                                                   scopes: list[str]) -> None:
    """A Loader's usual token (read and write on its team's path), or a read token with
    the telemetry scope: its reports show to its team and to the operators, not to
    another team."""
    c, job = auth_cluster, new_job()
    token = c.mint(scopes, ("/team-a",), name="team-a loader")
    team_b = c.mint(["read"], ("/team-b",), name="team-b reader")
    with make_loader(c.meta_url, "/team-a/ds", job, token=token) as loader:
        assert sum(len(b) for b in loader) == N
        wait_for(lambda: (j := jobs_as(c, token).get(job)) and j["summary"]["samples"] == N,
                 what="every sample reported")
        assert loader.stats()["reports_failed"] == 0
    assert jobs_as(c, c.admin_token)[job]["ranks"][0]["dataset"] == "/team-a/ds"
    assert job not in jobs_as(c, team_b)


def test_a_read_only_loader_reads_on_and_reports_no_more(
        auth_cluster: ThreadCluster, caplog: pytest.LogCaptureFixture) -> None:
    """Refused telemetry (403) does not come right with retrying: one warning that says
    which scope is missing, every batch still, and no more reports, the final one
    included."""
    c, job = auth_cluster, new_job()
    token = c.mint(["read"], ("/team-a",), name="read only")
    loader = make_loader(c.meta_url, "/team-a/ds", job, token=token, batch_size=2)
    try:
        it = iter(loader)
        got = [next(it)]
        wait_for(lambda: loader.stats()["reports_failed"] == 1, what="the refused report")
        time.sleep(0.6)                 # three report intervals: none is tried again
        got += list(it)
    finally:
        loader.close()
    assert indices(got) == list(range(N))
    stats = loader.stats()
    assert (stats["reports_sent"], stats["reports_failed"]) == (0, 1)
    assert "Forbidden" in stats["report_error"] and "telemetry" in stats["report_error"]
    warned = loader_warnings(caplog)
    assert len(warned) == 1 and "--scope telemetry" in warned[0], warned
    assert job not in jobs_as(c, c.admin_token)


def test_a_second_token_cannot_report_into_a_running_job(
        auth_cluster: ThreadCluster, caplog: pytest.LogCaptureFixture) -> None:
    """Another team, allowed to report on its own path, names a job that is running:
    its reports are refused (403, logged once) and the job shows only its owner's
    entry."""
    c, job = auth_cluster, new_job()
    owner = c.mint(["read", "telemetry"], ("/team-a",), name="team-a loader")
    other = c.mint(["read", "telemetry"], ("/team-b",), name="team-b loader")
    with make_loader(c.meta_url, "/team-a/ds", job, token=owner, report_interval=0.3) as a:
        iter(a)
        wait_for(lambda: jobs_as(c, owner).get(job), what="the owner's first report")
        spoof = make_loader(c.meta_url, "/team-b/ds", job, token=other, rank=1,
                            world_size=2)
        try:
            assert sum(len(b) for b in spoof) > 0
            wait_for(lambda: spoof.stats()["reports_failed"] == 1, what="the refused report")
            assert "belongs to another token" in spoof.stats()["report_error"]
        finally:
            spoof.close()
        listed = jobs_as(c, c.admin_token)[job]
        assert [(e["rank"], e["dataset"]) for e in listed["ranks"]] == [(0, "/team-a/ds")]
        assert a.stats()["reports_failed"] == 0
    assert job not in jobs_as(c, other)
    assert sum("belongs to another token" in w for w in loader_warnings(caplog)) == 1


async def test_servers_sharing_a_store_agree_on_who_owns_a_job(tmp_path: Path) -> None:
    """Two metadata servers over one store (here SQLite; PostgreSQL in production): one
    that has not seen a job learns its owner from the store before it records a report,
    and if both let a claim in at once, the earlier one is what every listing shows."""
    store = SQLiteStore(tmp_path / "meta.sqlite3")
    now = [100.0]
    a, b = (JobTable(clock=lambda: now[0], store=store) for _ in range(2))
    body = {"interval": 30.0, "world_size": 2, "samples": 1}
    try:
        await a.share(a.report("j", 0, None, dict(body), owner="x"))
        assert not b.knows("j")
        await b.load()                  # what the route does for a job it does not know
        with pytest.raises(Forbidden, match="job j belongs to another token"):
            b.report("j", 1, None, dict(body), owner="y")
        await b.share(b.report("j", 1, None, dict(body), owner="x"))
        # a race: c records a claim for "k" before it could see a's, which came first
        c = JobTable(clock=lambda: now[0], store=store)
        await a.share(a.report("k", 0, None, dict(body), owner="x"))
        now[0] += 1
        await c.share(c.report("k", 1, None, dict(body, samples=9), owner="y"))
        for table in (a, b, c):
            await table.load()
            listed = {j.job: [(e["rank"], e["samples"]) for e in j.ranks]
                      for j in table.jobs().jobs}
            assert listed == {"j": [(0, 1), (1, 1)], "k": [(0, 1)]}
            with pytest.raises(Forbidden):
                table.report("k", 1, None, dict(body), owner="y")
        now[0] += 91                     # every entry expired: the name is free again
        await b.load()
        assert not b.knows("k") and b.report("k", 0, None, dict(body), owner="y")
    finally:
        store.close()
