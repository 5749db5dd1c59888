"""Batched heartbeats (issue 30): one request per data server process for all its targets.

A real cluster whose data servers share one process (ThreadCluster) heartbeats through
``POST /v1/heartbeats`` only; with auth on, a batch speaks only for targets whose
credentials it carries: another target's credential refuses the whole batch, a revoked
one fails its own item (the target joins again), an unknown target answers 404 in its
place.  A metadata server without the route (an older one) gets one request per target.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from conftest import raw_http, start_cluster

from stager.config import load_config
from stager.data.beats import Beats, joined
from stager.protocol.heartbeats import BeatItem
from stager.protocol.messages import Heartbeat
from stager.protocol.routes import route
from stager.testing import ThreadCluster


def _served(meta_url: str, op: str) -> int:
    """How many ``op`` requests the metadata server answered 200 (its /metrics)."""
    text = raw_http(meta_url, "GET", "/metrics").body.decode()
    found = re.search(rf'^stager_requests_total{{op="{op}",status="200"}} (\S+)$', text, re.M)
    return int(float(found.group(1))) if found else 0


def _beat_body(*items: BeatItem) -> bytes:
    return json.dumps({"items": [i.to_json() for i in items]}).encode()


def _post(meta_url: str, body: bytes, token: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    reply = raw_http(meta_url, "POST", route("heartbeats").target(), body, headers)
    return reply.status, json.loads(reply.body)


def test_data_servers_of_one_process_heartbeat_in_one_request(cluster: ThreadCluster) -> None:
    cluster.wait_targets(3)
    start, single = _served(cluster.meta_url, "heartbeats"), \
        _served(cluster.meta_url, "heartbeat")
    time.sleep(2.0)         # ten heartbeat intervals of 0.2 s
    batches = _served(cluster.meta_url, "heartbeats") - start
    assert _served(cluster.meta_url, "heartbeat") == single == 0
    # three targets, ten rounds: ~10 batched requests, not ~30 single ones
    assert 5 <= batches <= 16, batches
    targets = json.loads(raw_http(cluster.meta_url, "GET", "/v1/targets").body)["targets"]
    assert all(time.time() - t["last_heartbeat"] < 2.0 for t in targets)


def test_a_batch_answers_per_item(cluster: ThreadCluster) -> None:
    cluster.wait_targets(3)
    known = cluster.target_id(0)
    status, answer = _post(cluster.meta_url, _beat_body(
        BeatItem(known, Heartbeat(capacity=1 << 30, used=5)), BeatItem("t-nobody", Heartbeat())))
    assert status == 200
    ok, missing = answer["results"]
    assert ok is None           # taken
    listed = json.loads(raw_http(cluster.meta_url, "GET", "/v1/targets").body)["targets"]
    assert next(t for t in listed if t["id"] == known)["state"] == "up"
    assert (missing["status"], missing["error"]) == (404, "not_found")


@pytest.mark.parametrize("body", [b"{}", b'{"items": [{"target_id": "../x", "heartbeat": {}}]}',
                                  b'{"items": [{"target_id": "t0"}]}', b"[1]",
                                  b'{"items": [{"target_id": "t0", "heartbeat": {}},'
                                  b' {"target_id": "t0", "heartbeat": {}}]}'])
def test_a_malformed_batch_is_400(cluster: ThreadCluster, body: bytes) -> None:
    status, answer = _post(cluster.meta_url, body)
    assert status == 400, answer
    assert answer["error"] == "bad_request"


@pytest.fixture(scope="module")
def auth_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("hbauth"), auth=True)
    c.wait_targets(3)
    yield c
    c.stop()


def _credential(c: ThreadCluster, i: int) -> str:
    """Data server ``i``'s credential ("" between dropping a refused one and keeping
    the next)."""
    path = c.root / f"data{i}" / "target.credential"
    return path.read_text().strip() if path.exists() else ""


def test_with_auth_the_data_servers_batch_with_their_credentials(
        auth_cluster: ThreadCluster) -> None:
    c = auth_cluster
    start = _served(c.meta_url, "heartbeats")
    time.sleep(1.0)
    assert _served(c.meta_url, "heartbeats") - start >= 3
    assert _served(c.meta_url, "heartbeat") == 0


def test_each_item_is_proven_by_its_own_credential(auth_cluster: ThreadCluster) -> None:
    c = auth_cluster
    t0, t1, t2 = (c.target_id(i) for i in range(3))
    beat = Heartbeat(capacity=1 << 30)
    # t0's credential carries the request (and proves t0); t1 proves itself
    status, answer = _post(c.meta_url, _beat_body(
        BeatItem(t0, beat), BeatItem(t1, beat, _credential(c, 1))), _credential(c, 0))
    assert (status, answer["results"]) == (200, [None, None])
    # named, not proven: t2 with no credential of its own, or with t1's
    for item in (BeatItem(t2, beat), BeatItem(t2, beat, _credential(c, 1))):
        status, answer = _post(c.meta_url, _beat_body(BeatItem(t0, beat), item),
                               _credential(c, 0))
        assert (status, answer["error"]) == (403, "forbidden"), answer
    # a user token is no target's credential, whatever its scopes
    status, answer = _post(c.meta_url, _beat_body(BeatItem(t0, beat), BeatItem(
        t2, beat, c.admin_token)), _credential(c, 0))
    assert status == 403, answer
    # a join token carries no batch
    status, answer = _post(c.meta_url, _beat_body(BeatItem(t0, beat, _credential(c, 0))),
                           c.join_token)
    assert status == 403, answer
    # no token at all
    status, answer = _post(c.meta_url, _beat_body(BeatItem(t0, beat, _credential(c, 0))))
    assert status == 401, answer


def test_a_forged_credential_fails_its_own_item(auth_cluster: ThreadCluster) -> None:
    c = auth_cluster
    t0, t1 = c.target_id(0), c.target_id(1)
    text = _credential(c, 1)
    forged = text[:-4] + ("AAAA" if not text.endswith("AAAA") else "BBBB")
    status, answer = _post(c.meta_url, _beat_body(
        BeatItem(t0, Heartbeat()), BeatItem(t1, Heartbeat(), forged)), _credential(c, 0))
    assert status == 200
    ok, refused = answer["results"]
    assert ok is None
    assert (refused["status"], refused["error"]) == (401, "unauthenticated")


async def _old_meta(hits: list[str]) -> web.AppRunner:
    """A metadata server from before the batch route: per-target heartbeats only."""
    async def heartbeat(request: web.Request) -> web.Response:
        hits.append(request.match_info["target_id"])
        return web.json_response({"id": request.match_info["target_id"], "node": "n",
                                  "url": "http://h:1"})

    app = web.Application()
    app.router.add_post("/v1/targets/{target_id}/heartbeat", heartbeat)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


async def test_an_older_metadata_server_gets_one_request_per_target(tmp_path: Path) -> None:
    hits: list[str] = []
    runner = await _old_meta(hits)
    port = runner.addresses[0][1]
    config = load_config({"heartbeat_interval": 0.2, "root": str(tmp_path)}, env={})
    try:
        async with joined(config) as hub:
            beats: Beats = hub.to(f"http://127.0.0.1:{port}")
            answers = await asyncio.gather(*(beats.send(BeatItem(f"t{i}", Heartbeat()), {})
                                             for i in range(3)))
            assert [a[0] for a in answers] == [200, 200, 200]
            assert sorted(hits) == ["t0", "t1", "t2"] and not beats.batched
            await beats.send(BeatItem("t9", Heartbeat()), {})      # straight away now
            assert hits[-1] == "t9"
    finally:
        await runner.cleanup()


def test_a_revoked_credential_joins_again_while_the_others_beat_on(
        auth_cluster: ThreadCluster) -> None:
    """An operator revokes one target's credential (to rotate it): that data server's
    next batched beat fails alone, it registers again with the join token and keeps a
    fresh credential; its neighbours' beats never stop."""
    c = auth_cluster
    t1, old = c.target_id(1), _credential(c, 1)
    admin = {"Authorization": f"Bearer {c.admin_token}"}
    tokens = json.loads(raw_http(c.meta_url, "GET", route("list_tokens").target(),
                                 headers=admin).body)["tokens"]
    token_id = next(t["id"] for t in tokens if t["name"] == f"target:{t1}"
                    and t.get("revoked") in (None, 0, False))
    reply = raw_http(c.meta_url, "POST", route("revoke_token").target(token_id=token_id),
                     b"{}", {**admin, "Content-Type": "application/json"})
    assert reply.status == 200, reply.body
    deadline = time.time() + 10
    while time.time() < deadline and _credential(c, 1) in (old, ""):
        time.sleep(0.1)
    assert _credential(c, 1) not in (old, "")
    time.sleep(0.6)
    targets = json.loads(raw_http(c.meta_url, "GET", "/v1/targets",
                                  headers=admin).body)["targets"]
    assert all(t["state"] == "up" and time.time() - t["last_heartbeat"] < 1.5
               for t in targets), targets


_GOOD = {"capacity": 10, "used": 2, "chunks": 3, "bytes_read": 4, "bytes_written": 5}
_SCRUB = {"state": "running", "passes": 1, "chunks_done": 2, "started": 3, "finished": 4.5}


FAST = [
    [{"target_id": "t0", "heartbeat": _GOOD}, {"target_id": "t1", "heartbeat": {}}],
    [{"target_id": "t0", "heartbeat": {**_GOOD, "scrub": _SCRUB}, "credential": "c.x"}],
    [{"target_id": "t0", "heartbeat": {**_GOOD, "unknown": [1]}}],
    [{"target_id": "t0", "heartbeat": {**_GOOD, "scrub": None}, "credential": None}],
]
DEFERRED = [
    [{"target_id": "t0", "heartbeat": {**_GOOD, "used": None}}],          # null: a default
    [{"target_id": "t0", "heartbeat": {**_GOOD, "used": -1}}],
    [{"target_id": "t0", "heartbeat": {**_GOOD, "used": 1 << 63}}],
    [{"target_id": "t0", "heartbeat": {**_GOOD, "used": True}}],
    [{"target_id": "t0", "heartbeat": {**_GOOD, "used": 1.5}}],
    [{"target_id": "t0", "heartbeat": {**_GOOD, "scrub": {**_SCRUB, "state": "odd"}}}],
    [{"target_id": "t0", "heartbeat": {**_GOOD, "scrub": {**_SCRUB, "passes": -1}}}],
    [{"target_id": "../t0", "heartbeat": _GOOD}],
    [{"target_id": "t0", "heartbeat": _GOOD, "credential": ""}],
    [{"target_id": "t0", "heartbeat": _GOOD}, {"target_id": "t0", "heartbeat": _GOOD}],
    [{"target_id": "t0"}],
    [{"target_id": "t0", "heartbeat": [1]}],
]


@pytest.mark.parametrize(("items", "fast"), [(i, True) for i in FAST] +
                         [(i, False) for i in DEFERRED])
def test_the_fast_decoder_takes_what_the_reference_takes_or_defers(items: list,
                                                                   fast: bool) -> None:
    """``decode_batch`` (msgspec) reads a plainly valid batch exactly as
    ``BeatItem.from_json`` does, and answers ``None`` (the reference decides) for
    everything else: it never takes a batch the reference refuses, nor reads one
    differently."""
    from stager.errors import BadRequest
    from stager.protocol.batch import parse_items
    from stager.protocol.heartbeats import decode_batch

    raw = json.dumps({"items": items}).encode()
    try:
        reference = parse_items(json.loads(raw), BeatItem.from_json, key=lambda i: i.target_id)
    except BadRequest:
        reference = None
    assert decode_batch(raw) == (reference if fast else None)
    if fast:
        assert reference is not None
