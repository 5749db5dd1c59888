"""Auth on, every route of every server: who gets in and who does not (issue 18).

Parametrized from the route table (:data:`~stager.protocol.routes.ROUTES`), so a
new route without a case in :data:`auth_world.CASES` fails here.  For each route:
no credential → 401; a forged, expired or revoked one (or none of ours at all) →
401; the right scope on the wrong prefix, or the wrong scope → 403; the right
credential → the normal answer.  Public routes answer whatever is sent.  Every
refusal and every mutating request leaves a line on the ``stager.audit`` logger.

Then what the matrix cannot say alone: a read capability for file A reads A and
nothing else, and writes nothing; listings show only what a token's prefixes
lead to.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from auth_world import CASES, FILE_A, Sent, World, as_json, get, post
from conftest import Reply, start_cluster
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from stager.auth.tokens import CLUSTER
from stager.checksum import crc32c, to_hex
from stager.protocol import headers as H
from stager.protocol.routes import ROUTES, Route, route, routes_for
from stager.web.authmw import CHATTER, MAX_CAPABILITIES

PARAMS = [pytest.param(role, r, id=f"{role}-{r.op}")
          for role in ("meta", "data") for r in routes_for(role)]
GUARDED = [p for p in PARAMS if p.values[1].access.scope != "public"]  # type: ignore[union-attr]
BAD = {"meta": ("forged", "expired", "revoked", "garbage", "capability"),
       "data": ("forged", "expired", "garbage", "token")}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    cluster = start_cluster(tmp_path_factory.mktemp("auth"), 3, auth=True)
    try:
        w = World(cluster)
        other = Ed25519PrivateKey.generate()
        past = time.time() - 7200
        revoked = w.cluster.mint(["admin"], name="revoked")
        token_id = next(t["id"] for t in w.admin("GET", route("list_tokens").target())
                        .json()["tokens"] if t["name"] == "revoked")
        w.admin("POST", route("revoke_token").target(token_id=token_id))
        w.creds |= {
            "meta:forged": w.token(["admin"], key=other),
            "meta:expired": w.token(["admin"], ttl=60, now=past),
            "meta:revoked": revoked, "meta:garbage": "not-a-token",
            "meta:capability": w.creds["cluster"],
            "data:forged": w.cap("*", CLUSTER, key=other, target=w.targets[0]["id"]),
            "data:expired": w.cap("*", CLUSTER, ttl=60, now=past, target=w.targets[0]["id"]),
            "data:garbage": "stg1.e30.AAAA", "data:token": w.creds["admin"],
        }
        yield w
    finally:
        cluster.stop()


@pytest.fixture(autouse=True)
def _tidy(world: World) -> Iterator[None]:
    yield
    world.tidy()


@pytest.fixture
def audit(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="stager.audit")
    return caplog


def refused(reply: Reply, status: int, rule: Route) -> None:
    where = f"{rule.method} {rule.path}: {reply.status} {reply.body[:200]!r}"
    assert reply.status == status, where
    if rule.method != "HEAD":       # no body to a HEAD
        assert reply.headers["Content-Type"].startswith("application/json"), where
        body = reply.json()
        assert body["error"] == {401: "unauthenticated", 403: "forbidden"}[status], where
        assert isinstance(body["message"], str), where


def audited(caplog: pytest.LogCaptureFixture, op: str, status: int) -> None:
    """A line for ``op`` with ``status`` reaches the audit log (the server writes it as
    the handler returns: maybe just after a streamed answer's last byte)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        lines = [r.getMessage() for r in caplog.records if r.name == "stager.audit"]
        if any(f" op={op} " in line and line.endswith(f"status={status}") for line in lines):
            return
        time.sleep(0.02)
    raise AssertionError(f"no audit line op={op} status={status} in {lines}")


def mutating(role: str, rule: Route) -> bool:
    """What the audit log must show: on the metadata server every request but a read
    (or a machine's chatter: heartbeats, telemetry, capability requests); on
    a data server the maintenance routes (a line per chunk written would drown it)."""
    assert rule.access is not None
    if role == "meta":
        return rule.method not in ("GET", "HEAD") and rule.op not in CHATTER
    return rule.access.scope == "cluster"


# -- the matrix ----------------------------------------------------------------------------
def test_every_route_has_a_case() -> None:
    assert set(CASES) == {r.op for r in ROUTES}


def test_every_case_names_what_it_can() -> None:
    """A wrong-scope case wherever a scope is needed that another could lack (a read
    capability is the least there is), a wrong-prefix one wherever a path, a file or
    the whole cluster is (a data server's maintenance covers no file)."""
    for role, rule in (p.values for p in GUARDED):
        assert isinstance(rule, Route) and rule.access is not None
        case = CASES[rule.op]
        least = rule.access.scope in ("any", "read") and role == "data" \
            or rule.access.scope == "any" and rule.access.on == "none"
        assert least or case.scope is not None, rule.op
        assert rule.access.on in ("none",) or role == "data" and rule.access.on == "cluster" \
            or case.prefix is not None, rule.op


@pytest.mark.parametrize(("role", "rule"), PARAMS)
def test_no_credential_is_401(world: World, audit: pytest.LogCaptureFixture, role: str,
                              rule: Route) -> None:
    reply = world.send(role, CASES[rule.op].build(world))
    if rule.access.scope == "public":      # type: ignore[union-attr]
        assert reply.status == 200, reply.body[:200]
        return
    refused(reply, 401, rule)
    audited(audit, rule.op, 401)


BAD_PARAMS = [pytest.param(*p.values, kind, id=f"{p.id}-{kind}")
              for p in PARAMS for kind in BAD[p.values[0]]]  # type: ignore[index]


@pytest.mark.parametrize(("role", "rule", "kind"), BAD_PARAMS)
def test_a_bad_credential_is_401(world: World, audit: pytest.LogCaptureFixture, role: str,
                                 rule: Route, kind: str) -> None:
    reply = world.send(role, CASES[rule.op].build(world), f"{role}:{kind}")
    if rule.access.scope == "public":      # type: ignore[union-attr]
        assert reply.status == 200, reply.body[:200]
        return
    refused(reply, 401, rule)
    audited(audit, rule.op, 401)


@pytest.mark.parametrize(("role", "rule"), PARAMS)
def test_the_right_credential_gets_the_normal_answer(world: World,
                                                     audit: pytest.LogCaptureFixture,
                                                     role: str, rule: Route) -> None:
    case = CASES[rule.op]
    reply = world.send(role, case.build(world), case.right)
    assert reply.status in case.ok, f"{rule.op}: {reply.status} {reply.body[:300]!r}"
    if reply.headers.get("Content-Type", "").startswith("application/json") and reply.body:
        body = reply.json()
        for item in body.get("results", []) if isinstance(body, dict) else []:
            assert item is None or "error" not in item, f"{rule.op}: {body}"
    if mutating(role, rule):
        audited(audit, rule.op, reply.status)


WRONG_SCOPE = [p for p in GUARDED if CASES[p.values[1].op].scope]  # type: ignore[union-attr]
WRONG_PREFIX = [p for p in GUARDED if CASES[p.values[1].op].prefix]  # type: ignore[union-attr]


@pytest.mark.parametrize(("role", "rule"), WRONG_SCOPE)
def test_the_wrong_scope_is_403(world: World, audit: pytest.LogCaptureFixture, role: str,
                                rule: Route) -> None:
    reply = world.send(role, CASES[rule.op].build(world), CASES[rule.op].scope)
    refused(reply, 403, rule)
    audited(audit, rule.op, 403)


@pytest.mark.parametrize(("role", "rule"), WRONG_PREFIX)
def test_the_wrong_prefix_or_file_is_403(world: World, audit: pytest.LogCaptureFixture,
                                         role: str, rule: Route) -> None:
    reply = world.send(role, CASES[rule.op].build(world), CASES[rule.op].prefix)
    refused(reply, 403, rule)
    audited(audit, rule.op, 403)


# -- between servers: a join token and a target credential do their purpose, nothing else --
SERVER_CREDS = {"join": {"register_target"},
                "target": {"register_target", "heartbeat", "heartbeats", "leave_target",
                           "scrub_report"},
                # an S3 gateway's: it reads, writes, lists and mints nothing
                "s3gateway": {"s3key_verify"}}
ELSEWHERE = [pytest.param(r, cred, id=f"{r.op}-{cred}") for cred, purpose in SERVER_CREDS.items()
             for r in routes_for("meta")
             if r.op not in purpose and r.access.scope != "public"]  # type: ignore[union-attr]


@pytest.mark.parametrize(("rule", "cred"), ELSEWHERE)
def test_a_servers_credential_is_refused_outside_its_purpose(world: World, rule: Route,
                                                             cred: str) -> None:
    """A stolen storage node's join token or target credential, or an S3 gateway's
    credential: 403 on every route of the metadata server that is not its job, the ones
    any user token may use (status, the target listing, capability requests) included."""
    refused(world.send("meta", CASES[rule.op].build(world), cred), 403, rule)


def test_a_join_token_cannot_move_or_take_over_a_registered_target(world: World) -> None:
    """Finding 1: the same join token re-registered an existing target id with a new
    URL, and it stuck while the real server kept heartbeating."""
    real = world.targets[0]
    hijack = {**real, "url": "http://127.0.0.1:7199"}
    reply = world.send("meta", post("register_target", hijack), "join")
    refused(reply, 403, route("register_target"))
    same_url = world.send("meta", post("register_target", real), "join")
    refused(same_url, 403, route("register_target"))        # its credential is pinned
    urls = {t["id"]: t["url"] for t in world.admin(
        "GET", route("list_targets").target()).json()["targets"]}
    assert urls[real["id"]] == real["url"]
    # its own credential moves nothing but itself; another target's moves nothing
    other = world.send("meta", post("register_target", hijack), "target_other")
    refused(other, 403, route("register_target"))
    again = world.send("meta", post("register_target", real), "target")
    assert again.status == 200 and again.json()["credential"] is None, again.body[:300]


def test_a_capability_for_one_target_is_refused_by_every_other(world: World) -> None:
    """Finding 1: a rogue target was sent the metadata server's ``file: "*"``
    capability, and with it read another team's chunks from a real data server and
    listed every chunk.  Now each names the one target it was sent to."""
    for cred in ("cluster_other", world.cap("*", "read", holder="0" * 32,
                                            target=world.other)):
        for sent in (get("list_chunks"), get("get_chunk", chunk=f"{world.a}.0"),
                     post("batch_read", {"items": [[f"{world.a}.0", 0, 10]]}),
                     post("purge", {"file_ids": [world.a]})):
            reply = world.send("data", sent, cred)
            assert reply.status == 403, (sent.target, reply.status, reply.body[:200])
    # ... and the one for this target still reads here (file A: 3 replicas on 3 targets)
    assert world.send("data", get("get_chunk", chunk=f"{world.a}.0"), "cluster").body == FILE_A


# -- data servers: a capability is for one file and one operation ------------------------
def test_a_read_capability_reads_its_file_and_nothing_else(world: World) -> None:
    a, b = f"{world.a}.0", f"{world.b}.0"
    assert world.send("data", Sent("GET", route("get_chunk").target(chunk=a)),
                      "read_a").body == FILE_A
    for op, sent in (("get_chunk", get("get_chunk", chunk=b)),
                     ("head_chunk", get("head_chunk", chunk=b)),
                     ("batch_read", post("batch_read", {"items": [[a, 0, 10], [b, 0, 10]]}))):
        refused(world.send("data", sent, "read_a"), 403, route(op))
    data = b"overwritten"
    put = Sent("PUT", route("put_chunk").target(chunk=a), data, {H.CRC32C: crc_hex(data)})
    refused(world.send("data", put, "read_a"), 403, route("put_chunk"))
    assert world.send("data", Sent("GET", route("get_chunk").target(chunk=a)),
                      "read_a").body == FILE_A


def test_a_write_capability_writes_and_reads_back_its_own_file_only(world: World) -> None:
    chunk = f"{world.u['file_id']}.{next(world.fresh)}"
    data = b"written then read back"
    put = Sent("PUT", route("put_chunk").target(chunk=chunk), data, {H.CRC32C: crc_hex(data)})
    assert world.send("data", put, "write_u").status == 201
    read = world.send("data", Sent("GET", route("get_chunk").target(chunk=chunk)), "write_u")
    assert (read.status, read.body) == (200, data)
    other = Sent("GET", route("get_chunk").target(chunk=f"{world.a}.0"))
    refused(world.send("data", other, "write_u"), 403, route("get_chunk"))


def test_several_capabilities_in_one_header_each_count(world: World) -> None:
    both = f"{world.creds['read_a']} {world.creds['read_b']}"
    sent = post("batch_read", {"items": [[f"{world.a}.0", 0, 4], [f"{world.b}.0", 0, 4]]})
    reply = world.send("data", sent, both)
    assert (reply.status, reply.body) == (200, b"AAAABBBB")


def test_a_bearer_token_to_a_data_server_is_401(world: World) -> None:
    sent = Sent("GET", route("get_chunk").target(chunk=f"{world.a}.0"))
    refused(world.send("data", sent, extra={H.AUTHORIZATION: f"Bearer {world.creds['admin']}"}),
            401, route("get_chunk"))


# -- the metadata server: what a token's prefixes show ------------------------------------
def test_listings_show_only_what_the_prefixes_lead_to(world: World) -> None:
    for path in ("/m/seen/f", "/m/hidden/f", "/m/seenother"):
        world.admin("PUT", route("gateway_put").target(path=path), b"x")
    world.creds["seen"] = world.cluster.mint(["read"], ("/m/seen",), name="seen")

    def names(op: str, path: str) -> list[str]:
        reply = world.send("meta", Sent("GET", route(op).target(path=path)), "seen")
        assert reply.status == 200, reply.body[:200]
        return [Path(e["path"]).name for e in reply.json()["entries"]]

    assert names("list", "/") == ["m"]
    assert names("list", "/m") == ["seen"]          # not "seenother": segment boundaries
    assert names("gateway_get", "/m") == ["seen"]
    assert names("list", "/m/seen") == ["f"]
    assert world.send("meta", Sent("GET", route("stat").target(path="/m")), "seen").status == 200
    for op, path in (("list", "/m/hidden"), ("stat", "/m/hidden/f"), ("stat", "/m/seenother"),
                     ("gateway_get", "/m/hidden/f"), ("gateway_get", "/m/hidden")):
        refused(world.send("meta", Sent("GET", route(op).target(path=path)), "seen"), 403,
                route(op))


def test_a_revoked_token_is_refused_from_the_next_request_on(world: World) -> None:
    text = world.cluster.mint(["read"], ("/m",), name="short-lived")
    sent = Sent("GET", route("stat").target(path="/m/a"))
    assert world.send("meta", sent, text).status == 200
    token_id = next(t["id"] for t in world.admin("GET", route("list_tokens").target())
                    .json()["tokens"] if t["name"] == "short-lived")
    world.admin("POST", route("revoke_token").target(token_id=token_id))
    refused(world.send("meta", sent, text), 401, route("stat"))


def crc_hex(data: bytes) -> str:
    return to_hex(crc32c(data))


# -- regressions ---------------------------------------------------------------------------
def test_a_listing_cursor_never_names_a_hidden_entry(world: World) -> None:
    """A page of entries the token may not see once handed back the last one's name as
    the next cursor: paging with ``limit=1`` listed every name of the directory."""
    for path in ("/m/pg/aaa-hidden/f", "/m/pg/mmm-seen/f", "/m/pg/zzz-hidden/f"):
        world.admin("PUT", route("gateway_put").target(path=path), b"x")
    world.creds["pg"] = world.cluster.mint(["read"], ("/m/pg/mmm-seen",), name="pg")
    cursors, shown, after = [], [], ""
    while True:
        sent = get("list", path="/m/pg", query={"limit": 1, "after": after or None})
        page = world.send("meta", sent, "pg").json()
        shown += [e["path"] for e in page["entries"]]
        if page["next"] is None:
            break
        cursors.append(after := page["next"])
    assert (shown, cursors) == (["/m/pg/mmm-seen"], ["mmm-seen"])


def test_a_batch_naming_no_file_still_needs_the_scope(world: World) -> None:
    """The body's files are checked in the handler; with none named, a read
    capability once had a chunk batch written (201)."""
    empty = Sent("POST", route("batch_write").target(), b'{"items":[]}\n')
    refused(world.send("data", empty, "read_u"), 403, route("batch_write"))
    assert world.send("data", empty, "write_u").status == 201


def test_an_audit_line_stays_one_line(world: World, audit: pytest.LogCaptureFixture) -> None:
    """A chunk id is any URL segment: ``%0A`` in it once wrote a second, forged line."""
    forged = "x%0Aholder=admin op=purge path=- status=200"
    sent = Sent("GET", "/v1/chunks/" + forged.replace(" ", "%20"))
    refused(world.send("data", sent), 401, route("get_chunk"))
    audited(audit, "get_chunk", 401)
    lines = [r.getMessage() for r in audit.records if r.name == "stager.audit"]
    assert lines and not any("\n" in line for line in lines), lines


def test_a_batch_carries_as_many_capabilities_as_the_gate_takes(world: World) -> None:
    """One capability per file a batch touches, all in one header: aiohttp's default
    limit of 8190 bytes a field refused (400, before any of our code) a batch of 50
    small files.  Up to :data:`MAX_CAPABILITIES` of the longest kind fit now, one more
    is 401.  All of them new: verified off the loop (the loop guard would fail a test
    whose server held its loop ~0.6 s verifying 4096 on it)."""
    caps = [world.cap(world.a, "read", holder=f"{i:032x}") for i in range(MAX_CAPABILITIES)]
    sent = post("batch_read", {"items": [[f"{world.a}.0", 0, 4]]})
    reply = world.send("data", sent, " ".join(caps))
    assert (reply.status, reply.body) == (200, b"AAAA")
    longest = world.cap("f" * 32, "write", holder="f" * 32, ttl=2**62)
    assert len(longest) == 276
    most = " ".join([longest] * (MAX_CAPABILITIES - 1) + [caps[0]])
    reply = world.send("data", sent, most)
    assert (reply.status, reply.body) == (200, b"AAAA")
    refused(world.send("data", sent, most + " " + caps[0]), 401, route("batch_read"))


# -- loader telemetry: who reports a job, who sees it (issue 26) ----------------------------
def report_to(world: World, job: str, rank: int, cred: str, **fields: object) -> Reply:
    body = {"interval": 30, "world_size": 4, "samples": 1, **fields}
    return world.send("meta", Sent("PUT", route("report_rank").target(job=job, rank=rank),
                                   as_json(body), {"Content-Type": "application/json"}), cred)


def listed(world: World, cred: str) -> dict[str, list[tuple[int, int]]]:
    """{job: [(rank, samples)]} as ``cred`` sees the jobs."""
    reply = world.send("meta", get("list_jobs"), cred)
    assert reply.status == 200, reply.body[:200]
    return {j["job"]: [(e["rank"], e["samples"]) for e in j["ranks"]]
            for j in reply.json()["jobs"]}


def test_a_reader_cannot_report_telemetry(world: World) -> None:
    """A read token on another team's path once added a fake rank to that team's job,
    and a fake job beside it: both showed in ``stager jobs`` and the dashboard."""
    job, fake = f"team-m-{next(world.fresh)}", f"fake-{next(world.fresh)}"
    assert report_to(world, job, 0, "loader_m", dataset="/m/a", samples=7).status == 200
    for cred, name, dataset in (("read_o", job, "/m/a"), ("read_o", fake, "/other"),
                                ("read_m", job, "/m/a"), ("read", fake, "/m")):
        reply = report_to(world, name, 1, cred, dataset=dataset, samples=999)
        refused(reply, 403, route("report_rank"))
        assert "'telemetry' scope" in reply.json()["message"]
    shown = listed(world, "admin")
    assert shown[job] == [(0, 7)] and fake not in shown


def test_a_job_takes_reports_from_the_token_that_reported_it_first(world: World) -> None:
    job = f"owned-{next(world.fresh)}"
    assert report_to(world, job, 0, "loader_m", dataset="/m", samples=5).status == 200
    for cred in ("write_m", "admin"):     # each may report on /m, but this job is not theirs
        reply = report_to(world, job, 1, cred, dataset="/m", samples=999)
        refused(reply, 403, route("report_rank"))
        assert reply.json()["message"] == f"job {job} belongs to another token"
        refused(report_to(world, job, 0, cred, dataset="/m", samples=999), 403,
                route("report_rank"))
    assert report_to(world, job, 1, "loader_m", dataset="/m/b", samples=6).status == 200
    assert listed(world, "admin")[job] == [(0, 5), (1, 6)]


def test_a_report_needs_the_telemetry_scope_on_its_dataset(world: World) -> None:
    job = f"paths-{next(world.fresh)}"
    refused(report_to(world, job, 0, "loader_m", dataset="/other/x"), 403, route("report_rank"))
    refused(report_to(world, job, 0, "loader_m"), 403, route("report_rank"))    # no dataset: /
    bad = report_to(world, job, 0, "loader_m", dataset="/m/../other")
    assert (bad.status, bad.json()["error"]) == (400, "invalid_path"), bad.body[:200]
    assert report_to(world, job, 0, "write_m", dataset="/m/").status == 200   # write implies it
    jobs = {j["job"]: j for j in world.send("meta", get("list_jobs"), "read_m").json()["jobs"]}
    assert [e["dataset"] for e in jobs[job]["ranks"]] == ["/m"]       # as checked: normalized


def test_a_listing_shows_a_token_the_jobs_it_may_read(world: World) -> None:
    m_job, o_job = f"on-m-{next(world.fresh)}", f"on-o-{next(world.fresh)}"
    assert report_to(world, m_job, 0, "loader_m", dataset="/m/a").status == 200
    assert report_to(world, o_job, 0, "admin_o", dataset="/other/x").status == 200
    seen = {cred: listed(world, cred) for cred in ("read_m", "read_o", "read", "admin")}
    assert m_job in seen["read_m"] and o_job not in seen["read_m"]
    assert o_job in seen["read_o"] and m_job not in seen["read_o"]
    assert {m_job, o_job} <= set(seen["read"]) & set(seen["admin"])


# -- capabilities: a refusal names the file id, never its path (issue 26) ------------------
def test_a_refused_capability_names_the_file_not_where_it_is(world: World) -> None:
    for op, file_id, cred, path in (("read", world.a, "read_o", "/m/a"),
                                    ("write", world.v["file_id"], "write_o", "/m/v")):
        reply = world.send("meta", post("capabilities", {"op": op, "file_ids": [file_id]}),
                           cred)
        refused(reply, 403, route("capabilities"))
        assert file_id in reply.json()["message"], reply.body
        assert path not in reply.body.decode() and "/m" not in reply.body.decode(), reply.body
