"""Batched writes: create, commit and abort on the metadata server (each takes a batch;
a single write is a batch of one), chunk batches (POST /v1/write) on data servers,
AsyncClient.write_many, and the tree put and staging paths built on them.  Real
servers on loopback throughout.

A malformed batch fails whole and changes nothing; an item that fails against the
namespace fails alone, its error in its place; a file is visible only once
committed, whole.
"""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from pathlib import Path

import pytest
from conftest import meta_requests, start_cluster

from stager import AsyncClient, Client
from stager.checksum import crc32c, to_hex
from stager.config import load_config
from stager.errors import (
    AlreadyExists,
    BadRequest,
    InvalidPath,
    IsADirectory,
    NotADirectory,
    NoTargets,
    NotFound,
)
from stager.protocol.batch import MAX_BATCH_ITEMS
from stager.protocol.models import FileInfo, LayoutSpec
from stager.protocol.routes import ROUTES
from stager.stage import stage_sync
from stager.testing import ThreadCluster

SMALL = 64 * 1024


def post(http, url: str, route: str, body: object):  # type: ignore[no-untyped-def]
    return http(url, "POST", route, body=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"})


def assert_error(reply, status: int, code: str) -> dict:  # type: ignore[no-untyped-def]
    assert reply.status == status, (reply.status, reply.body[:300])
    assert reply.headers["Content-Type"].startswith("application/json")
    body = reply.json()
    assert body["error"] == code and body["message"], body
    assert b"Traceback" not in reply.body
    return body


def pending_uploads(cluster: ThreadCluster, prefix: str) -> list[str]:
    """Paths of uploads begun and not yet committed or aborted, read from the
    metadata server's own database (a second, read-only connection)."""
    db = sqlite3.connect(f"file:{cluster.root / 'meta' / 'meta.sqlite3'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT path FROM uploads WHERE path LIKE ?", (prefix + "/%",))
        return sorted(r[0] for r in rows)
    finally:
        db.close()


# -- create / commit / abort over HTTP, each a batch --------------------------------------------
def test_create_then_commit_batch_makes_files_visible_only_at_commit(
        cluster: ThreadCluster, http, ns: str) -> None:
    items = [{"path": f"{ns}/d{i % 2}/f{i}"} for i in range(5)]
    reply = post(http, cluster.meta_url, "/v1/create", {"items": items})
    assert reply.status == 200, reply.body
    uploads = reply.json()["results"]
    assert [u["path"] for u in uploads] == [i["path"] for i in items]
    assert all(len(u["file_id"]) == 32 and u["layout"]["targets"] for u in uploads)
    assert len(pending_uploads(cluster, ns)) == 5
    # begun, not committed: nothing to see
    assert_error(http(cluster.meta_url, "GET", f"/v1/stat{ns}/d0/f0"), 404, "not_found")
    commits = [{"file_id": u["file_id"], "size": 0, "checksums": [], "mtime": 1000.0 + i}
               for i, u in enumerate(uploads)]
    reply = post(http, cluster.meta_url, "/v1/commit", {"items": commits})
    assert reply.status == 200, reply.body
    infos = reply.json()["results"]
    assert [(i["path"], i["size"], i["mtime"]) for i in infos] == [
        (items[k]["path"], 0, 1000.0 + k) for k in range(5)]
    assert pending_uploads(cluster, ns) == []
    listing = http(cluster.meta_url, "GET", f"/v1/list{ns}/d1").json()
    assert [e["path"] for e in listing["entries"]] == [f"{ns}/d1/f1", f"{ns}/d1/f3"]


def test_failed_items_fail_alone_and_leave_nothing(cluster: ThreadCluster, client: Client,
                                                   http, ns: str) -> None:
    client.pipe(f"{ns}/exists", b"old")
    client.pipe(f"{ns}/file", b"a file")
    client.mkdir(f"{ns}/dir")
    items = [{"path": f"{ns}/exists", "overwrite": False},       # 409 exists
             {"path": f"{ns}/file/below"},                        # 409 not a directory
             {"path": f"{ns}/dir"},                               # 409 is a directory
             {"path": f"{ns}/nowhere/x", "parents": False},       # 404 no parent
             {"path": f"{ns}/ok"}]
    reply = post(http, cluster.meta_url, "/v1/create", {"items": items})
    assert reply.status == 200, reply.body
    results = reply.json()["results"]
    assert [(r.get("error"), r.get("status")) for r in results[:4]] == [
        ("exists", 409), ("not_a_directory", 409), ("is_a_directory", 409), ("not_found", 404)]
    assert all(r["message"] for r in results[:4])
    assert "file_id" in results[4]
    assert pending_uploads(cluster, ns) == [f"{ns}/ok"]
    # commit: one good, one unknown, one with the wrong number of checksums
    other = post(http, cluster.meta_url, "/v1/create",
                 {"items": [{"path": f"{ns}/wrong"}]}).json()["results"][0]
    commits = [{"file_id": results[4]["file_id"], "size": 0, "checksums": []},
               {"file_id": uuid.uuid4().hex, "size": 0, "checksums": []},
               {"file_id": other["file_id"], "size": 10, "checksums": []}]
    reply = post(http, cluster.meta_url, "/v1/commit", {"items": commits})
    got = reply.json()["results"]
    assert got[0]["path"] == f"{ns}/ok"
    assert (got[1]["error"], got[1]["status"]) == ("upload_not_found", 404)
    assert (got[2]["error"], got[2]["status"]) == ("bad_request", 400)
    assert client.cat(f"{ns}/exists") == b"old"
    assert not client.exists(f"{ns}/wrong")             # its commit failed: still pending
    assert pending_uploads(cluster, ns) == [f"{ns}/wrong"]
    reply = post(http, cluster.meta_url, "/v1/abort",
                 {"file_ids": [other["file_id"], uuid.uuid4().hex]})
    assert reply.status == 200
    aborted = reply.json()["results"]
    assert aborted[0] is None and aborted[1]["error"] == "upload_not_found"
    assert pending_uploads(cluster, ns) == []


def test_a_commit_that_lost_its_race_changes_nothing(cluster: ThreadCluster, client: Client,
                                                     http, ns: str) -> None:
    created = post(http, cluster.meta_url, "/v1/create", {"items": [
        {"path": f"{ns}/a", "overwrite": False}, {"path": f"{ns}/b"}]}).json()["results"]
    client.pipe(f"{ns}/a", b"first")           # someone else got there in between
    reply = post(http, cluster.meta_url, "/v1/commit", {"items": [
        {"file_id": c["file_id"], "size": 0, "checksums": []} for c in created]})
    results = reply.json()["results"]
    assert results[0]["error"] == "exists" and results[1]["path"] == f"{ns}/b"
    assert client.cat(f"{ns}/a") == b"first"
    assert client.stat(f"{ns}/b").size == 0


@pytest.mark.parametrize("items, status, code, index", [
    ([{"path": "/ok"}, {"path": "/a/../b"}], 400, "invalid_path", 1),
    ([{"path": "/ok"}, {"path": "/x//y"}], 400, "invalid_path", 1),
    ([{"path": "/ok"}, {"path": 7}], 400, "bad_request", 1),
    ([{"path": "/ok"}, "not an object"], 400, "bad_request", 1),
    ([{"path": "/ok"}, {"path": "/z", "layout": {"chunk_size": 5}}], 400, "invalid_layout", 1),
    ([{"path": "/ok"}, {"path": "/z", "overwrite": "yes"}], 400, "bad_request", 1),
    ([{"path": "/dup"}, {"path": "/other"}, {"path": "/dup/"}], 400, "bad_request", 2),
])
def test_a_malformed_create_batch_fails_whole(cluster: ThreadCluster, http, ns: str,
                                              items: list, status: int, code: str,
                                              index: int) -> None:
    items = [{**i, "path": ns + i["path"] if isinstance(i.get("path"), str) and
              i["path"].startswith("/") else i["path"]} if isinstance(i, dict) else i
             for i in items]
    body = assert_error(post(http, cluster.meta_url, "/v1/create", {"items": items}),
                        status, code)
    assert body["details"]["index"] == index
    assert pending_uploads(cluster, ns) == []          # not even the good items began


def test_malformed_commit_and_abort_batches_fail_whole(cluster: ThreadCluster, http,
                                                       ns: str) -> None:
    url = cluster.meta_url
    created = post(http, url, "/v1/create",
                   {"items": [{"path": f"{ns}/f"}]}).json()["results"][0]
    good = {"file_id": created["file_id"], "size": 0, "checksums": []}
    for items, code in (([good, {**good}], "bad_request"),                  # twice
                        ([good, {"file_id": "nothex", "size": 0, "checksums": []}],
                         "bad_request"),
                        ([good, {"file_id": uuid.uuid4().hex, "size": 1,
                                 "checksums": ["xyz"]}], "bad_request"),
                        ([good, {"file_id": uuid.uuid4().hex, "size": True,
                                 "checksums": []}], "bad_request")):
        body = assert_error(post(http, url, "/v1/commit", {"items": items}), 400, code)
        assert body["details"]["index"] == 1
    assert_error(post(http, url, "/v1/commit", {"items": {"a": 1}}), 400, "bad_request")
    assert_error(post(http, url, "/v1/commit", {}), 400, "bad_request")
    assert_error(http(url, "POST", "/v1/commit", body=b"{not json"), 400, "bad_request")
    assert_error(post(http, url, "/v1/abort", {"file_ids": [created["file_id"]] * 2}),
                 400, "bad_request")
    assert_error(post(http, url, "/v1/abort", {"file_ids": ["../x"]}), 400,
                 "bad_request")
    assert pending_uploads(cluster, ns) == [f"{ns}/f"]  # none of that touched it
    assert post(http, url, "/v1/commit", {"items": [good]}).status == 200


def test_batches_over_the_item_limit_are_413(cluster: ThreadCluster, http, ns: str) -> None:
    n = MAX_BATCH_ITEMS + 1
    body = assert_error(post(http, cluster.meta_url, "/v1/create",
                             {"items": [{"path": f"{ns}/f{i}"} for i in range(n)]}),
                        413, "too_large")
    assert body["details"]["limit"] == MAX_BATCH_ITEMS
    assert pending_uploads(cluster, ns) == []
    assert_error(post(http, cluster.meta_url, "/v1/commit", {"items": [
        {"file_id": uuid.uuid4().hex, "size": 0, "checksums": []}] * n}), 413, "too_large")
    assert_error(post(http, cluster.meta_url, "/v1/abort",
                      {"file_ids": [uuid.uuid4().hex for _ in range(n)]}), 413, "too_large")


def test_an_empty_batch_is_an_empty_answer(cluster: ThreadCluster, http) -> None:
    for route in ("/v1/create", "/v1/commit"):
        reply = post(http, cluster.meta_url, route, {"items": []})
        assert reply.status == 200 and reply.json() == {"results": []}


def test_openapi_documents_the_batch_routes(cluster: ThreadCluster, http) -> None:
    meta = http(cluster.meta_url, "GET", "/openapi.json").json()
    for route in ("/v1/create", "/v1/commit", "/v1/abort"):
        body = meta["paths"][route]["post"]["requestBody"]["content"]["application/json"]
        request = meta["components"]["schemas"][body["schema"]["$ref"].rsplit("/", 1)[1]]
        assert request["type"] == "object" and set(request["required"]) & {"items", "file_ids"}
    data = http(cluster.data[0].url, "GET", "/openapi.json").json()  # type: ignore[union-attr]
    assert "post" in data["paths"]["/v1/write"]


def test_each_write_has_one_route_and_the_batch_twins_are_gone(cluster: ThreadCluster,
                                                                http) -> None:
    for op in ("create", "commit", "abort"):       # create_token mints tokens: not a write
        assert [r.op for r in ROUTES if r.path.startswith(f"/v1/{op}")] == [op]
        assert [r.path for r in ROUTES if r.op.startswith(op) and r.op != "create_token"
                ] == [f"/v1/{op}"]
    assert not [r.op for r in ROUTES if r.op.endswith("_batch")]
    paths = http(cluster.meta_url, "GET", "/openapi.json").json()["paths"]
    for twin in ("/v1/create-batch", "/v1/commit-batch", "/v1/abort-batch"):
        assert twin not in paths
        reply = post(http, cluster.meta_url, twin, {"items": []})
        assert reply.status in (404, 405), (twin, reply.status)


def test_a_batch_of_one_is_the_single_write(cluster: ThreadCluster, client: Client, http,
                                            ns: str) -> None:
    """What the single create and commit answered, each as the one item of a batch."""
    def one(route: str, body: dict) -> dict:  # type: ignore[type-arg]
        reply = post(http, cluster.meta_url, route, body)
        assert reply.status == 200, reply.body
        [result] = reply.json()["results"]
        return result  # type: ignore[no-any-return]

    root = one("/v1/create", {"items": [{"path": "/"}]})
    assert (root["error"], root["status"]) == ("is_a_directory", 409)   # as it always was
    bad = {"items": [{"path": f"{ns}/x", "layout": {"replicas": 9}}]}     # malformed: whole
    assert_error(post(http, cluster.meta_url, "/v1/create", bad), 400, "invalid_layout")
    huge = one("/v1/create", {"items": [{"path": f"{ns}/x", "layout": {"chunk_size": 1 << 40}}]})
    assert (huge["error"], huge["status"]) == ("invalid_layout", 400)     # over this server's
    client.pipe(f"{ns}/kept", b"kept")
    taken = one("/v1/create", {"items": [{"path": f"{ns}/kept", "overwrite": False}]})
    assert (taken["error"], taken["status"]) == ("exists", 409)
    made = one("/v1/create", {"items": [{"path": f"{ns}/new", "layout": {"chunk_size": 4096}}]})
    assert made["layout"]["chunk_size"] == 4096 and made["locations"]
    wrong = one("/v1/commit", {"items": [{"file_id": made["file_id"], "size": 5000,
                                          "checksums": ["00000000"]}]})
    assert (wrong["error"], wrong["status"]) == ("bad_request", 400)
    assert "2 chunks" in wrong["message"]
    commit = json.dumps({"items": [{"file_id": made["file_id"], "size": 0,
                                    "checksums": []}]}).encode()
    key = {"Content-Type": "application/json", "Idempotency-Key": uuid.uuid4().hex}
    answers = []
    for attempt in ("1", "2"):      # a retry of an answered commit: the same file again
        reply = http(cluster.meta_url, "POST", "/v1/commit", body=commit,
                     headers={**key, "X-Stager-Attempt": attempt})
        assert reply.status == 200, reply.body
        answers.append(reply.json()["results"])
    [done] = answers[0]
    assert (done["path"], done["size"], done["file_id"]) == (f"{ns}/new", 0, made["file_id"])
    assert answers[1] == answers[0]
    gone = one("/v1/abort", {"file_ids": [made["file_id"]]})
    assert (gone["error"], gone["status"]) == ("upload_not_found", 404)
    assert client.cat(f"{ns}/kept") == b"kept" and client.stat(f"{ns}/new").size == 0


# -- chunk batches on a data server ---------------------------------------------------------
def chunk_batch(chunks: list[tuple[str, bytes]], crcs: list[int] | None = None) -> bytes:
    crcs = crcs or [crc32c(d) for _, d in chunks]
    head = json.dumps({"items": [[c, len(d), to_hex(k)]
                                 for (c, d), k in zip(chunks, crcs, strict=True)]})
    return head.encode() + b"\n" + b"".join(d for _, d in chunks)


def test_a_chunk_batch_stores_every_chunk(cluster: ThreadCluster, http, payload) -> None:
    url = cluster.data[0].url  # type: ignore[union-attr]
    fid = uuid.uuid4().hex
    chunks = [(f"{fid}.{i}", payload(1000 * i + 1)) for i in range(4)] + [(f"{fid}.9", b"")]
    reply = http(url, "POST", "/v1/write", body=chunk_batch(chunks))
    assert reply.status == 201, reply.body
    assert reply.json() == {"chunks": 5, "bytes": sum(len(d) for _, d in chunks),
                            "stored": [{"chunk": c, "size": len(d), "crc32c": to_hex(crc32c(d))}
                                       for c, d in chunks]}
    for name, data in chunks:
        got = http(url, "GET", f"/v1/chunks/{name}")
        assert got.status == 200 and got.body == data
        assert got.headers["X-Stager-Crc32c"] == to_hex(crc32c(data))
    again = http(url, "POST", "/v1/write", body=chunk_batch(chunks))   # idempotent
    assert again.status == 201


def test_a_bad_chunk_batch_stores_nothing(cluster: ThreadCluster, http, payload) -> None:
    url = cluster.data[1].url  # type: ignore[union-attr]
    fid = uuid.uuid4().hex
    chunks = [(f"{fid}.{i}", payload(5000 + i)) for i in range(3)]
    crcs = [crc32c(d) for _, d in chunks]
    crcs[2] ^= 1
    assert_error(http(url, "POST", "/v1/write", body=chunk_batch(chunks, crcs)), 400,
                 "checksum_mismatch")
    good = chunk_batch(chunks)
    head, _, data = good.partition(b"\n")
    cases = [
        (head + b"\n" + data[:-1], "bad_request"),                # a byte short
        (head + b"\n" + data + b"x", "bad_request"),              # a byte over
        (data, "bad_request"),                                    # no JSON line
        (b"[1, 2]\n" + data, "bad_request"),                      # not an object
        (b'{"items": [["nope", 1, "00000000"]]}\n' + b"x", "bad_request"),
        (b'{"items": [["' + fid.encode() + b'.0", 1, "zz"]]}\n' + b"x", "bad_request"),
        (chunk_batch([chunks[0], chunks[0]]), "bad_request"),     # the same chunk twice
    ]
    for body, code in cases:
        assert_error(http(url, "POST", "/v1/write", body=body), 400, code)
    for name, _ in chunks:
        assert http(url, "GET", f"/v1/chunks/{name}").status == 404
    root = cluster.data[1].root  # type: ignore[union-attr]
    assert not [p for p in Path(root).rglob("*.tmp")]


def test_a_chunk_batch_over_the_limit_is_413(tmp_path: Path, slow_callbacks, http) -> None:
    cluster = start_cluster(tmp_path, 1, max_chunk_size=SMALL)
    try:
        url = cluster.data[0].url  # type: ignore[union-attr]
        fid = uuid.uuid4().hex
        body = chunk_batch([(f"{fid}.{i}", os.urandom(SMALL // 2)) for i in range(3)])
        assert_error(http(url, "POST", "/v1/write", body=body), 413, "too_large")
        assert http(url, "GET", f"/v1/chunks/{fid}.0").status == 404
    finally:
        cluster.stop()


def test_a_full_target_refuses_a_chunk_batch_whole(tmp_path: Path, slow_callbacks,
                                                   http) -> None:
    cluster = start_cluster(tmp_path, 1, capacity=4 * SMALL)
    try:
        url = cluster.data[0].url  # type: ignore[union-attr]
        fid = uuid.uuid4().hex
        body = chunk_batch([(f"{fid}.{i}", os.urandom(SMALL)) for i in range(5)])
        assert_error(http(url, "POST", "/v1/write", body=body), 507, "no_space")
        assert http(url, "GET", f"/v1/chunks/{fid}.0").status == 404
        assert not list((tmp_path / "data0").rglob("*.tmp"))
    finally:
        cluster.stop()


# -- AsyncClient.write_many -----------------------------------------------------------------
async def test_write_many_is_byte_exact(aclient: AsyncClient, ns: str, payload) -> None:
    sizes = [0, 1, 100, SMALL - 1, SMALL, SMALL + 1, 3 * SMALL + 7] + [16384] * 40
    items = [(f"{ns}/d{i % 3}/f{i:03d}", payload(s + i), 1_000_000.0 + i)
             for i, s in enumerate(sizes)]
    results = await aclient.write_many(items, layout=LayoutSpec(chunk_size=SMALL, replicas=2))
    assert all(not isinstance(r, Exception) for r in results), results
    for (path, data, mtime), info in zip(items, results, strict=True):
        assert info.path == path and info.size == len(data) and info.mtime == mtime
        assert info.layout is not None and info.layout.replicas == 2
        assert await aclient.cat(path) == data
        stat = await aclient.stat(path, cached=False)
        assert stat.file_id == info.file_id
        assert stat.checksums == tuple(crc32c(data[i:i + SMALL])
                                       for i in range(0, len(data), SMALL))


async def test_write_many_reports_each_failure_in_its_place(aclient: AsyncClient,
                                                            ns: str) -> None:
    await aclient.pipe(f"{ns}/taken", b"old")
    await aclient.pipe(f"{ns}/plain", b"a file")
    results = await aclient.write_many([(f"{ns}/new1", b"1"), (f"{ns}/taken", b"2"),
                                        (f"{ns}/plain/below", b"3"), (f"{ns}", b"4"),
                                        (f"{ns}/new2", b"5")], overwrite=False)
    assert [type(r) for r in results[1:4]] == [AlreadyExists, NotADirectory, IsADirectory]
    assert await aclient.cat(f"{ns}/new1") == b"1" and await aclient.cat(f"{ns}/new2") == b"5"
    assert await aclient.cat(f"{ns}/taken") == b"old"
    with pytest.raises(NotADirectory):
        await aclient.stat(f"{ns}/plain/below", cached=False)


async def test_write_many_bad_input_raises_and_writes_nothing(aclient: AsyncClient,
                                                              ns: str) -> None:
    with pytest.raises(InvalidPath):
        await aclient.write_many([(f"{ns}/ok", b"x"), (f"{ns}/a/../b", b"y")])
    with pytest.raises(BadRequest):
        await aclient.write_many([(f"{ns}/same", b"x"), (f"{ns}/same/", b"y")])
    with pytest.raises(NotFound):
        await aclient.stat(ns)
    assert await aclient.write_many([]) == []


async def test_write_many_spans_several_batches(aclient: AsyncClient, ns: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from stager.client import bulk

    monkeypatch.setattr(bulk, "MAX_BATCH_ITEMS", 7)      # the server allows more
    monkeypatch.setattr(bulk, "CHUNK_BATCH_BYTES", 3000)
    items = [(f"{ns}/f{i:02d}", os.urandom(1000 + i)) for i in range(30)]
    results = await aclient.write_many(items)
    assert [r.path for r in results] == [p for p, _ in items]   # type: ignore[union-attr]
    for path, data in items:
        assert await aclient.cat(path) == data


def test_write_many_with_a_dead_target_routes_around_it(tmp_path: Path, slow_callbacks,
                                                         http) -> None:
    cluster = start_cluster(tmp_path, 3)
    try:
        config = load_config({"write_retries": 0, "retries": 0, "connect_timeout": 1},
                             env={})
        with Client(cluster.meta_url, config=config) as c:
            dead = cluster.data[2].url  # type: ignore[union-attr]
            cluster.stop_data(2)        # still listed as up: the metadata server places on it
            items = [(f"/dead/f{i:02d}", os.urandom(5000 + i)) for i in range(24)]
            results = c.write_many(items, layout=LayoutSpec(stripe_count=1))
            for (path, data), r in zip(items, results, strict=True):
                assert isinstance(r, FileInfo), r
                assert r.locations and dead not in r.locations.values()
                assert c.cat(path) == data
            states = {t.url: t.state for t in c.targets()}
            assert states[dead] == "suspect"            # reported by the writer at once
            assert pending_uploads(cluster, "/dead") == []
    finally:
        cluster.stop()


def test_write_many_that_cannot_keep_its_replicas_fails_whole_and_shows_nothing(
        tmp_path: Path, slow_callbacks, http) -> None:
    cluster = start_cluster(tmp_path, 2)
    try:
        config = load_config({"write_retries": 0, "retries": 0, "connect_timeout": 1},
                             env={})
        with Client(cluster.meta_url, config=config) as c:
            cluster.stop_data(1)
            items = [(f"/short/f{i:02d}", os.urandom(3000 + i)) for i in range(10)]
            results = c.write_many(items, layout=LayoutSpec(replicas=2))
            for (path, _), r in zip(items, results, strict=True):
                assert isinstance(r, NoTargets) and "need 2 nodes, 1 up" in str(r), r
                assert not c.exists(path)
            assert pending_uploads(cluster, "/short") == []     # aborted
    finally:
        cluster.stop()


# -- put of a tree and staging use the batches ---------------------------------------------
def test_put_of_a_tree_batches_small_files(cluster: ThreadCluster, client: Client, http,
                                           tmp_path: Path, ns: str) -> None:
    src = tmp_path / "tree"
    files = {f"a/s{i:02d}.bin": os.urandom(100 * i) for i in range(40)}
    files["big/large.bin"] = os.urandom((4 << 20) + 3)            # over a chunk: one by one
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
        os.utime(src / rel, (1_500_000_000, 1_500_000_000))
    before = meta_requests(http, cluster)
    infos = client.put(src, ns)
    after = meta_requests(http, cluster)
    assert [i.path for i in infos] == [f"{ns}/{rel}" for rel in sorted(files)]
    for rel, data in files.items():
        assert client.cat(f"{ns}/{rel}") == data
        assert client.stat(f"{ns}/{rel}").mtime == 1_500_000_000
    # one batch for the 40 small files, and one batch of one for large.bin
    assert after.get("create", 0) - before.get("create", 0) == 2
    assert after.get("commit", 0) - before.get("commit", 0) == 2


def test_staging_small_files_goes_in_batches(cluster: ThreadCluster, client: Client, http,
                                             tmp_path: Path, ns: str) -> None:
    src = tmp_path / "src"
    files = {f"d{i % 4}/s{i:03d}.bin": os.urandom(3000 + i) for i in range(300)}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    before = meta_requests(http, cluster)
    report = stage_sync(client, f"file://{src}", ns)
    after = meta_requests(http, cluster)
    assert report.copied == 300 and report.manifest_files == 300
    assert 1 <= after.get("create", 0) - before.get("create", 0) <= 3    # not one a file
    assert 1 <= after.get("commit", 0) - before.get("commit", 0) <= 3
    for rel, data in list(files.items())[::23]:
        assert client.cat(f"{ns}/{rel}") == data
    again = stage_sync(client, f"file://{src}", ns)
    assert again.copied == 0 and again.skipped == 300          # staged mtimes match
