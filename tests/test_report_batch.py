"""Batched loader telemetry (issue 30): many loaders' reports in one ``POST /v1/jobs/reports``.

The batch is checked whole (a bad item fails the request with its index, and nothing is
taken); a job another token reports, or a full table, fails its own item only; a dataset
the token may not report on refuses the whole request."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import raw_http, start_cluster
from test_loader_telemetry import entry, jobs, new_job
from test_loader_telemetry import report as short_report

from stager.meta.jobtable import JOBS, YIELD_EVERY
from stager.protocol.jobreport import batch_item
from stager.testing import ThreadCluster

PATH = "/v1/jobs/reports"


def report(**fields: Any) -> dict[str, Any]:
    """A report whose entry lives 15 s: a loaded machine lists it before it expires."""
    return short_report(**{"interval": 5.0, **fields})


def send(url: str, items: list[dict[str, Any]], token: str | None = None,
         raw: bytes | None = None) -> Any:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return raw_http(url, "POST", PATH, raw if raw is not None else
                    json.dumps({"items": items}).encode(), headers)


def test_a_nodes_ranks_report_in_one_request(cluster: ThreadCluster) -> None:
    """Eight ranks and one DataLoader worker, one request: each item answers its entry,
    and the job lists them as if each had reported alone."""
    url, job = cluster.meta_url, new_job()
    items = [batch_item(job, r, report(world_size=8, samples=100 * r, stall_fraction=r / 10))
             for r in range(8)] + [batch_item(job, 3, report(world_size=8), worker=0)]
    r = send(url, items)
    assert r.status == 200, r.body
    results = r.json()["results"]
    assert [(x["job"], x["rank"], x["worker"]) for x in results] == \
        [(job, i, None) for i in range(8)] + [(job, 3, 0)]
    summary = jobs(url)[job]["summary"]
    assert (summary["entries"], summary["ranks"], summary["world_size"]) == (9, 8, 8)
    assert summary["worst"] == {"rank": 7, "worker": None}
    assert entry(url, job, 5)["samples"] == 500           # type: ignore[index]


@pytest.mark.parametrize(("index", "item", "word"), [
    (1, {"samples": -1}, "samples"),
    (1, {"world_size": 1}, "outside world_size"),
    (1, {"stall_fraction": 2.0}, "stall_fraction"),
    (1, {"targets": [{"requests": 1}]}, "target"),
])
def test_a_bad_item_fails_the_whole_batch_with_its_index(
        cluster: ThreadCluster, index: int, item: dict[str, Any], word: str) -> None:
    url, job = cluster.meta_url, new_job()
    items = [batch_item(job, 0, report()), batch_item(job, 1, report(**item))]
    r = send(url, items)
    assert r.status == 400 and r.json()["error"] == "bad_request", r.body
    assert r.json()["details"]["index"] == index and word in r.json()["message"], r.body
    assert job not in jobs(url)                     # the good item 0 was not taken either


@pytest.mark.parametrize(("body", "word"), [
    (b'{"items": [{"job": "j", "rank": 0, "report": {"interval": 1, "world_size": 1, '
     b'"samples": NaN}}]}', "NaN is not JSON"),
    (b"{not json", "malformed"),
    (b'{"items": {}}', "items"),
    (json.dumps({"items": [batch_item("-bad", 0, report())]}).encode(), "job name"),
    (json.dumps({"items": [batch_item("j", 0, report())] * 2}).encode(), "also item 0"),
])
def test_malformed_batches_are_400_json(cluster: ThreadCluster, body: bytes, word: str
                                        ) -> None:
    r = send(cluster.meta_url, [], raw=body)
    assert r.status == 400 and r.json()["error"] == "bad_request", r.body
    assert word in r.json()["message"], r.body


def test_a_big_batch_is_taken_whole_between_turns_of_the_loop(cluster: ThreadCluster
                                                               ) -> None:
    """A job leader's thousand ranks: more than YIELD_EVERY items, every one taken."""
    url, job = cluster.meta_url, new_job()
    world = 3 * YIELD_EVERY + 5
    r = send(url, [batch_item(job, rank, report(world_size=world)) for rank in range(world)])
    assert r.status == 200 and len(r.json()["results"]) == world, r.body[:300]
    assert jobs(url)[job]["summary"]["ranks"] == world


def test_a_full_table_fails_only_the_new_entries(cluster: ThreadCluster) -> None:
    """Past the table's bound a new entry's item is a 503 in its place; an entry the
    table holds is still updated, in the same request."""
    assert cluster.meta is not None
    table = cluster.meta.app[JOBS]
    url, job = cluster.meta_url, new_job()
    limit = table.max_entries
    assert send(url, [batch_item(job, 0, report())]).status == 200
    table.max_entries = len(table.live())
    try:
        r = send(url, [batch_item(job, 0, report(samples=7)), batch_item(job, 1, report())])
    finally:
        table.max_entries = limit
    assert r.status == 200, r.body
    first, second = r.json()["results"]
    assert first["rank"] == 0 and second["error"] == "unavailable" and second["status"] == 503
    assert entry(url, job, 0)["samples"] == 7            # type: ignore[index]
    assert entry(url, job, 1) is None


@pytest.mark.slow
def test_with_auth_a_batch_is_its_tokens(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A dataset the token may not report on refuses the whole batch (403, nothing
    taken); a job another token reports fails its own item (403 in its place)."""
    c = start_cluster(tmp_path_factory.mktemp("report-batch-auth"), 1, auth=True)
    try:
        a = c.mint(["read", "telemetry"], ("/team-a",), name="team-a loader")
        b = c.mint(["read", "telemetry"], ("/team-b",), name="team-b loader")
        mine, theirs = new_job(), new_job()
        assert send(c.meta_url, [batch_item(theirs, 0, report(dataset="/team-b/ds"))],
                    b).status == 200
        r = send(c.meta_url, [batch_item(mine, 0, report(dataset="/team-a/ds")),
                              batch_item(mine, 1, report(dataset="/team-b/ds"))], a)
        assert r.status == 403 and r.json()["error"] == "forbidden", r.body
        r = send(c.meta_url, [batch_item(mine, 0, report(dataset="/team-a/ds")),
                              batch_item(theirs, 1, report(dataset="/team-a/ds"))], a)
        assert r.status == 200, r.body
        ok, refused = r.json()["results"]
        assert ok["job"] == mine and refused["error"] == "forbidden", r.body
        listed = raw_http(c.meta_url, "GET", "/v1/jobs",
                          headers={"Authorization": f"Bearer {c.admin_token}"}).json()
        ranks = {j["job"]: [e["rank"] for e in j["ranks"]] for j in listed["jobs"]}
        assert ranks[mine] == [0] and ranks[theirs] == [0]
    finally:
        c.stop()


@pytest.mark.parametrize("path", ["/v1/jobs/j/ranks/0", PATH])
def test_a_chunked_body_over_the_limit_is_413(cluster: ThreadCluster, path: str) -> None:
    """A body without a Content-Length is held to the same limit once read."""
    from http.client import HTTPConnection
    from urllib.parse import urlsplit

    from stager.protocol.jobreport import MAX_BATCH_BYTES, MAX_REPORT_BYTES

    limit = MAX_REPORT_BYTES if path != PATH else MAX_BATCH_BYTES
    url = urlsplit(cluster.meta_url)
    conn = HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        pieces = (b" " * (64 << 10) for _ in range(limit // (64 << 10) + 1))
        conn.request("POST" if path == PATH else "PUT", path, body=pieces,
                     headers={"Content-Type": "application/json"}, encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 413 and json.loads(resp.read())["error"] == "too_large"
    finally:
        conn.close()
