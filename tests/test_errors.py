"""Bad input gets a clear JSON error with the right status, and loses nothing.

Every error body must be ``{"error": CODE, "message": ...}``; a 500 with a
traceback, or a log line saying a handler failed unexpectedly, fails the test.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Iterator
from http.client import IncompleteRead
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import start_cluster
from hypothesis import given, settings
from hypothesis import strategies as st

from stager import AsyncClient, Client
from stager.config import load_config
from stager.errors import ERROR_TABLE, InvalidPath, TargetUnavailable, error_from_wire
from stager.protocol import paths
from stager.protocol.batch import one, read_results
from stager.protocol.models import FileInfo, LayoutSpec
from stager.protocol.routes import route
from stager.testing import ThreadCluster

SMALL = 64 * 1024


@pytest.fixture(autouse=True)
def _no_unhandled_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    yield
    unhandled = [r.getMessage() for r in caplog.records if "unhandled error" in r.getMessage()]
    assert not unhandled, f"a handler raised an unexpected exception: {unhandled}"


def assert_error(reply, status: int, code: str | None = None) -> dict:  # type: ignore[no-untyped-def]
    """The reply is a JSON error with ``status`` (and ``code``), never a traceback."""
    assert reply.status == status, (reply.status, reply.body[:300])
    assert reply.headers["Content-Type"].startswith("application/json")
    body = reply.json()
    assert set(body) >= {"error", "message"}, body
    assert isinstance(body["message"], str) and body["message"]
    assert b"Traceback" not in reply.body
    if code is not None:
        assert body["error"] == code, body
    return body


# -- paths -------------------------------------------------------------------------------
BAD_PATHS = [
    "a/../b", "../etc/passwd", "a/./b", "a//b", "/a", "a/b%00", "a%00b",
    "%2e%2e/x", "a/%2e%2e/b", "a/%2E%2E", "a%2fb", "a%2F..%2Fb", "..%2f..%2fetc",
    "a/%2e/b", "a/b/..", "a/%01b",
]


@pytest.mark.parametrize("bad", BAD_PATHS)
@pytest.mark.parametrize("method, prefix", [("GET", "/v1/files/"), ("HEAD", "/v1/files/"),
                                            ("PUT", "/v1/files/"), ("DELETE", "/v1/files/"),
                                            ("GET", "/v1/stat/"), ("GET", "/v1/list/")])
def test_bad_paths_in_urls_are_400(cluster: ThreadCluster, http, client: Client, method: str,
                                   prefix: str, bad: str) -> None:
    r = http(cluster.meta_url, method, prefix + bad, body=b"x" if method == "PUT" else None)
    if method == "HEAD":                       # no body on HEAD: the status must say it
        assert r.status == 400
    else:
        assert_error(r, 400, "invalid_path")


def test_bad_put_created_nothing(cluster: ThreadCluster, http, client: Client) -> None:
    for bad in BAD_PATHS:
        http(cluster.meta_url, "PUT", "/v1/files/" + bad, body=b"evil")
    names = {e.name for e in client.ls("/")}
    assert not names & {"etc", "b", "x", "a"}


@pytest.mark.parametrize("route, field", [("/v1/mkdir", "path"), ("/v1/create", "path"),
                                          ("/v1/remove", "path"), ("/v1/rename", "src"),
                                          ("/v1/rename", "dst"), ("/v1/layout", "path")])
@pytest.mark.parametrize("bad", ["/a/../b", "/a\x00b", "//", "/a//b", "/.", "/a/\x01/"])
def test_bad_paths_in_json_bodies_are_400(cluster: ThreadCluster, http, route: str,
                                          field: str, bad: str) -> None:
    body: dict[str, Any] = {"path": "/ok", "src": "/ok", "dst": "/ok2",
                            "layout": {"replicas": 1}, field: bad}
    if route == "/v1/create":           # a batch: the bad item fails it whole
        body = {"items": [{"path": "/ok"}, body]}
    r = http(cluster.meta_url, "POST", route, body=json.dumps(body).encode(),
             headers={"Content-Type": "application/json"})
    assert_error(r, 400, "invalid_path")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab./\x00%2e\\"), max_size=12))
def test_normalize_either_refuses_or_gives_a_canonical_path(text: str) -> None:
    try:
        out = paths.normalize(text)
    except InvalidPath:
        return
    assert out.startswith("/") and "\x00" not in out
    assert out == "/" or not out.endswith("/")
    assert all(seg not in ("", ".", "..") for seg in out[1:].split("/")) or out == "/"
    assert paths.normalize(out) == out


# -- missing things, routes, methods -------------------------------------------------------
def test_missing_is_404(cluster: ThreadCluster, http, ns: str) -> None:
    for method, path in [("GET", f"/v1/files{ns}/nope"), ("DELETE", f"/v1/files{ns}/nope"),
                         ("GET", f"/v1/stat{ns}/nope"), ("GET", f"/v1/list{ns}/nope")]:
        assert_error(http(cluster.meta_url, method, path), 404, "not_found")
    assert http(cluster.meta_url, "HEAD", f"/v1/files{ns}/nope").status == 404
    r = http(cluster.meta_url, "POST", "/v1/rename",
             body=json.dumps({"src": f"{ns}/nope", "dst": f"{ns}/x"}).encode())
    assert_error(r, 404, "not_found")
    r = http(cluster.meta_url, "POST", "/v1/commit", body=json.dumps(
        {"items": [{"file_id": "0" * 32, "size": 0, "checksums": []}]}).encode())
    [gone] = r.json()["results"]                # a batch of one: the error in its place
    assert (r.status, gone["error"], gone["status"]) == (200, "upload_not_found", 404)
    r = http(cluster.meta_url, "POST", "/v1/targets/t-nobody/heartbeat", body=b"{}")
    assert_error(r, 404, "not_found")


def test_a_heartbeat_with_a_count_out_of_range_is_400(cluster: ThreadCluster, http) -> None:
    """Counts are stored as SQLite INTEGERs; 2**64 was a 500 before it reached the target."""
    beat = f"/v1/targets/{cluster.target_id(0)}/heartbeat"
    for field, value in (("used", 1 << 64), ("capacity", -1), ("chunks", 1 << 63)):
        r = http(cluster.meta_url, "POST", beat, body=json.dumps({field: value}).encode())
        assert repr(field) in assert_error(r, 400, "bad_request")["message"]


def test_unknown_routes_and_wrong_methods(cluster: ThreadCluster, http) -> None:
    data_url = cluster.data[0].url  # type: ignore[union-attr]
    for base in (cluster.meta_url, data_url):
        assert_error(http(base, "GET", "/nope"), 404, "not_found")
        assert_error(http(base, "GET", "/v2/files/x"), 404, "not_found")
        r = http(base, "DELETE", "/v1/health")
        body = assert_error(r, 405, "method_not_allowed")
        assert "GET" in body["message"] and r.headers["Allow"] == "GET"
    r = http(cluster.meta_url, "PATCH", "/v1/files/x")
    assert_error(r, 405, "method_not_allowed")
    assert set(r.headers["Allow"].replace(" ", "").split(",")) == {"GET", "HEAD", "PUT",
                                                                   "DELETE"}
    assert_error(http(cluster.meta_url, "GET", "/v1/mkdir"), 405, "method_not_allowed")


# -- malformed bodies and parameters --------------------------------------------------------
@pytest.mark.parametrize("route, body", [
    ("/v1/mkdir", b"{not json"),
    ("/v1/mkdir", b"[1, 2]"),
    ("/v1/mkdir", b'"just a string"'),
    ("/v1/mkdir", b"\xff\xfe"),
    ("/v1/mkdir", b"{}"),                                     # missing field
    ("/v1/mkdir", b'{"path": 5}'),
    ("/v1/mkdir", b'{"path": "/x", "parents": "yes"}'),
    ("/v1/mkdir", b'{"path": "/x", "layout": {"chunk_size": "big"}}'),
    ("/v1/mkdir", b'{"path": "/x", "layout": {"stripes": 2}}'),
    ("/v1/layout", b'{"path": "/", "layout": 7}'),
    ("/v1/create", b'{"items": [{"path": "/x", "layout": {"replicas": true}}]}'),
    ("/v1/create", b'{"items": [{"path": "/x", "overwrite": 1}]}'),
    ("/v1/create", b'{"path": "/x"}'),                      # not a batch
    ("/v1/commit", b'{"items": [{"file_id": "nothex", "size": 0, "checksums": []}]}'),
    ("/v1/commit", b'{"items": [{"file_id": "' + b"0" * 32 + b'", "size": 0, '
                   b'"checksums": ["zz"]}]}'),
    ("/v1/commit", b'{"items": [{"file_id": "' + b"0" * 32 + b'", "size": "0", '
                   b'"checksums": []}]}'),
    ("/v1/abort", b'{"file_ids": [12]}'),
    ("/v1/abort", b'{"file_id": "' + b"0" * 32 + b'"}'),       # not a batch
    ("/v1/rename", b'{"src": "/a"}'),
    ("/v1/remove", b'{"path": "/x", "recursive": "no"}'),
    ("/v1/targets", b'{"id": "t1", "node": "n", "url": "ftp://x"}'),
    ("/v1/targets", b'{"id": "../../x", "node": "n", "url": "http://x"}'),
    ("/v1/targets", b'{"id": "t1", "node": "n", "url": "http://x", "capacity": -1.5}'),
    # counts are SQLite INTEGERs (64-bit): one out of range was a 500 (issue 18)
    ("/v1/targets", b'{"id": "t1", "node": "n", "url": "http://x", "used": 18446744073709551616}'),
    ("/v1/targets", b'{"id": "t1", "node": "n", "url": "http://x", "capacity": -1}'),
    ("/v1/targets", b'{"id": "t1", "node": "n", "url": "http://x", "chunks": 9223372036854775808}'),
    ("/v1/commit", b'{"items": [{"file_id": "' + b"0" * 32 + b'", '
                   b'"size": 9223372036854775808, "checksums": []}]}'),
    # text SQLite cannot store, Python's non-JSON constants, nesting past the stack (issue 18)
    ("/v1/mkdir", b'{"path": "/x\\ud800"}'),
    ("/v1/targets", b'{"id": "t1", "node": "\\udc00", "url": "http://x"}'),
    ("/v1/targets", b'{"id": "t1", "node": "n", "url": "http://x", "last_heartbeat": NaN}'),
    ("/v1/commit", b'{"items": [{"file_id": "' + b"0" * 32 + b'", "size": 0, '
                   b'"checksums": [], "mtime": Infinity}]}'),
    ("/v1/mkdir", b'{"path": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"),
])
def test_malformed_json_is_400(cluster: ThreadCluster, http, route: str, body: bytes) -> None:
    r = http(cluster.meta_url, "POST", route, body=body,
             headers={"Content-Type": "application/json"})
    code = assert_error(r, 400)["error"]
    assert code in {"bad_request", "invalid_layout", "invalid_path"}


@pytest.mark.parametrize("query", ["limit=abc", "limit=0", "limit=-3", "limit=1000001",
                                   "limit=18446744073709551616", "detail=maybe"])
def test_bad_query_parameters_are_400(cluster: ThreadCluster, http, query: str) -> None:
    assert_error(http(cluster.meta_url, "GET", f"/v1/list/?{query}"), 400, "bad_request")


async def test_commit_with_the_wrong_number_of_checksums(aclient: AsyncClient,
                                                        ns: str) -> None:
    if True:
        file_id, writer = await aclient.create(f"{ns}/c", layout=LayoutSpec(chunk_size=SMALL))
        await writer.write(b"x" * (SMALL + 1))
        await writer.close()
        async def commit(size: int, checksums: list[str]) -> FileInfo:
            answer = await aclient.meta.request(route("commit"), body={"items": [
                {"file_id": file_id, "size": size, "checksums": checksums}]})
            return one(read_results(answer, FileInfo.from_json))

        with pytest.raises(ValueError, match="2 chunks"):      # the item's error
            await commit(SMALL + 1, ["00000000"])
        with pytest.raises(ValueError, match="size"):           # the whole batch's
            await commit(-1, [])
        assert not await aclient.exists(f"{ns}/c")
        await aclient.abort(file_id)


def test_data_server_bad_input(cluster: ThreadCluster, http) -> None:
    url = cluster.data[0].url  # type: ignore[union-attr]
    assert_error(http(url, "GET", "/v1/chunks/not-a-chunk"), 400, "bad_request")
    assert_error(http(url, "GET", "/v1/chunks/..%2f..%2ftarget.json"), 400, "bad_request")
    assert_error(http(url, "PUT", "/v1/chunks/" + "a" * 32 + ".0", body=b"x"), 400,
                 "bad_request")                                   # no CRC header
    assert_error(http(url, "PUT", "/v1/chunks/" + "a" * 32 + ".0", body=b"x",
                      headers={"X-Stager-Crc32c": "xyz"}), 400, "bad_request")
    assert_error(http(url, "GET", "/v1/chunks/" + "b" * 32 + ".0"), 404, "chunk_not_found")
    for body in (b"{", b'{"items": "all"}', b'{"items": [["x", 0, 1]]}',
                 b'{"items": [["' + b"a" * 32 + b'.0", -1, 1]]}',
                 b'{"items": [["' + b"a" * 32 + b'.0", 0, 1.5]]}'):
        assert_error(http(url, "POST", "/v1/read", body=body), 400, "bad_request")
    assert_error(http(url, "POST", "/v1/purge", body=b'{"file_ids": ["../x"]}'), 400,
                 "bad_request")


def test_wire_errors_map_back_to_the_same_classes() -> None:
    for cls, status, code in ERROR_TABLE:
        err = error_from_wire(status, {"error": code, "message": "m", "details": {"k": 1}})
        assert type(err) is cls and err.details == {"k": 1} and str(err) == "m"
    assert isinstance(error_from_wire(418, {"error": "teapot"}), ValueError)
    assert isinstance(error_from_wire(502, None), Exception)


# -- limits: 413 -----------------------------------------------------------------------------
LIMIT = 256 * 1024


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory, slow_callbacks) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("limited"), 2, max_upload_size=LIMIT,
                      max_chunk_size=SMALL, chunk_size=SMALL, max_json_body=4096)
    yield c
    c.stop()


def test_upload_over_the_limit_is_413(limited: ThreadCluster, http) -> None:
    url = limited.meta_url
    assert http(url, "PUT", "/v1/files/lim/ok", body=b"k" * LIMIT).status == 201
    r = http(url, "PUT", "/v1/files/lim/ok", body=b"x" * (LIMIT + 1))
    assert_error(r, 413, "too_large")
    assert http(url, "GET", "/v1/files/lim/ok").body == b"k" * LIMIT     # old file intact

    def chunked():  # type: ignore[no-untyped-def]
        for _ in range(5):
            yield b"y" * (LIMIT // 4)

    r = http(url, "PUT", "/v1/files/lim/streamed", body=chunked())       # no length given
    assert_error(r, 413, "too_large")
    assert_error(http(url, "GET", "/v1/files/lim/streamed"), 404)


def test_json_body_over_the_limit_is_413(limited: ThreadCluster, http) -> None:
    body = json.dumps({"path": "/x", "pad": "p" * 5000}).encode()
    assert_error(http(limited.meta_url, "POST", "/v1/mkdir", body=body), 413, "too_large")
    data_url = limited.data[0].url  # type: ignore[union-attr]
    big = json.dumps({"items": [["a" * 32 + ".0", 0, 1]] * 500}).encode()
    assert_error(http(data_url, "POST", "/v1/read", body=big), 413, "too_large")


def test_chunk_over_the_limit_is_413(limited: ThreadCluster, http) -> None:
    from stager.checksum import crc32c

    data = b"z" * (SMALL + 1)
    r = http(limited.data[0].url, "PUT", "/v1/chunks/" + "c" * 32 + ".0",  # type: ignore[union-attr]
             body=data, headers={"X-Stager-Crc32c": f"{crc32c(data):08x}"})
    assert_error(r, 413, "too_large")
    chunks = list((limited.root / "data0" / "chunks").rglob("*"))
    assert not [p for p in chunks if p.is_file() and p.name.startswith("c" * 32)]


def test_chunk_size_over_the_limit_is_400(limited: ThreadCluster, http) -> None:
    r = http(limited.meta_url, "PUT", f"/v1/files/lim/big-chunks?chunk_size={2 * SMALL}",
             body=b"x")
    assert_error(r, 400, "invalid_layout")
    with Client(limited.meta_url, config=load_config(env={})) as c:
        with pytest.raises(ValueError):
            c.pipe("/lim/big-chunks", b"x", layout=LayoutSpec(chunk_size=2 * SMALL))
        with pytest.raises(ValueError):
            c.mkdir("/lim/d", layout=LayoutSpec(chunk_size=2 * SMALL))


# -- dead data servers: 503 naming the target; failed writes leave nothing -------------------
@pytest.fixture(scope="module")
def fault(tmp_path_factory: pytest.TempPathFactory, slow_callbacks) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("fault"), 3)
    yield c
    c.stop()


def data_index(cluster: ThreadCluster, target: str) -> int:
    return next(i for i in range(cluster.n) if cluster.target_id(i) == target)


def restart(cluster: ThreadCluster, i: int) -> None:
    """Start data server ``i`` again and wait until the metadata server has its new URL."""
    cluster.start_data(i)
    server = cluster.data[i]
    assert server is not None
    with Client(cluster.meta_url, config=load_config(env={})) as c:
        for _ in range(200):
            if any(t.id == cluster.target_id(i) and t.url == server.url and t.up
                   for t in c.targets()):
                return
            time.sleep(0.05)
    raise AssertionError(f"data server {i} did not re-register")


def test_dead_data_server_is_503_naming_the_target(fault: ThreadCluster, http,
                                                   payload) -> None:
    data = payload(SMALL * 3)
    with Client(fault.meta_url, config=load_config(env={})) as c:
        info = c.pipe("/dead/f.bin", data, layout=LayoutSpec(chunk_size=SMALL, stripe_count=3))
        assert info.layout is not None
        victim = info.layout.targets[1]                  # holds chunk 1
        i = data_index(fault, victim)
        fault.stop_data(i)
        try:
            with pytest.raises(TargetUnavailable) as err:
                c.cat("/dead/f.bin")
            assert victim in str(err.value) and err.value.details.get("target") == victim
            assert isinstance(err.value, ConnectionError)
            # the chunks on live targets still read
            assert c.cat("/dead/f.bin", 0, SMALL) == data[:SMALL]
            r = http(fault.meta_url, "GET", "/v1/files/dead/f.bin",
                     headers={"Range": f"bytes={SMALL}-"})
            body = assert_error(r, 503, "target_unavailable")
            assert victim in body["message"] and body["details"]["target"] == victim
            # a whole-file GET whose first chunk is fine has already sent 200: the body
            # is cut short, never silently complete
            with pytest.raises(IncompleteRead):
                http(fault.meta_url, "GET", "/v1/files/dead/f.bin")
        finally:
            restart(fault, i)
        assert c.cat("/dead/f.bin") == data


async def test_failed_write_leaves_no_half_file(fault: ThreadCluster, payload) -> None:
    data = payload(SMALL * 4)
    async with AsyncClient(fault.meta_url, config=load_config(env={})) as c:
        await c.pipe("/half/old.bin", b"old content")
        for path in ("/half/new.bin", "/half/old.bin"):
            f = await c.open(path, "wb", layout=LayoutSpec(chunk_size=SMALL, stripe_count=3))
            await f.write(data[:SMALL])                          # chunk 0 goes out
            await f.writer.flush()                   # type: ignore[union-attr]
            # Its only copy's server stops: the write cannot route around it.
            i = data_index(fault, f.writer.layout.targets[0])  # type: ignore[union-attr]
            await asyncio.to_thread(fault.stop_data, i)
            try:
                with pytest.raises(ConnectionError):
                    await f.write(data[SMALL:])
                    await f.close()
            finally:
                await asyncio.to_thread(restart, fault, i)
        assert not await c.exists("/half/new.bin")
        assert [e.name for e in await c.ls("/half")] == ["old.bin"]
        assert await c.cat("/half/old.bin") == b"old content"


def test_failed_gateway_put_leaves_no_half_file(fault: ThreadCluster, http, payload) -> None:
    assert http(fault.meta_url, "PUT", "/v1/files/gw/old.bin", body=b"old").status == 201
    fault.stop_data(2)
    victim = fault.target_id(2)
    try:
        # Three replicas on three nodes, one of them stopped: nothing to route to.
        for path in ("/gw/new.bin", "/gw/old.bin"):
            r = http(fault.meta_url, "PUT", f"/v1/files{path}?chunk_size={SMALL}&replicas=3",
                     body=payload(SMALL * 3))
            body = assert_error(r, 503, "no_targets")
            assert "3 nodes" in body["message"] or "3 distinct nodes" in body["message"]
        assert {t["id"]: t["state"] for t in http(fault.meta_url, "GET", "/v1/targets")
                .json()["targets"]}[victim] == "suspect"
    finally:
        restart(fault, 2)
    assert_error(http(fault.meta_url, "GET", "/v1/files/gw/new.bin"), 404, "not_found")
    assert http(fault.meta_url, "GET", "/v1/files/gw/old.bin").body == b"old"


def test_an_exception_inside_a_write_block_discards_the_file(client: Client, ns: str) -> None:
    client.pipe(f"{ns}/keep.bin", b"old")

    class Boom(Exception):
        pass

    for name in ("keep.bin", "new.bin"):
        with pytest.raises(Boom), client.open(f"{ns}/{name}", "wb") as f:
            f.write(b"x" * (SMALL * 70))           # more than a default chunk went out
            raise Boom
    assert client.cat(f"{ns}/keep.bin") == b"old"
    assert not client.exists(f"{ns}/new.bin")


def test_client_vanishing_mid_upload_leaves_nothing(cluster: ThreadCluster, client: Client,
                                                    ns: str, caplog: pytest.LogCaptureFixture,
                                                    ) -> None:
    """A gateway PUT whose client disconnects half-way never becomes a file, and the
    chunks it had already stored are collected.  The server logs it quietly."""
    caplog.set_level(logging.INFO, logger="stager.web")
    client.pipe(f"{ns}/cut.bin", b"previous")
    before = _all_chunks(cluster)
    url = urlsplit(cluster.meta_url)
    for name in ("cut.bin", "new.bin"):
        with socket.create_connection((url.hostname or "", url.port or 0)) as s:
            s.sendall(f"PUT /v1/files{ns}/{name} HTTP/1.1\r\nHost: x\r\n"
                      f"Content-Length: {100 << 20}\r\n\r\n".encode() + b"a" * (12 << 20))
            time.sleep(0.3)                       # long enough for some chunks to land
    deadline = time.monotonic() + 10
    while not _all_chunks(cluster) <= before:     # garbage collection purges the rest
        assert time.monotonic() < deadline, "chunks of the abandoned upload stayed"
        time.sleep(0.05)
    assert not client.exists(f"{ns}/new.bin")
    assert client.cat(f"{ns}/cut.bin") == b"previous"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert sum("the client went away" in r.getMessage() for r in caplog.records) == 2


def _all_chunks(cluster: ThreadCluster) -> set[str]:
    return {p.name for i in range(cluster.n)
            for p in (cluster.root / f"data{i}" / "chunks").rglob("*") if p.is_file()}


def test_writes_avoid_targets_marked_down(fault: ThreadCluster) -> None:
    fault.stop_data(0)
    down = fault.target_id(0)
    try:
        with Client(fault.meta_url, config=load_config(env={})) as c:
            for _ in range(100):                         # target_timeout is 1.5 s here
                if any(t.id == down and not t.up for t in c.targets()):
                    break
                time.sleep(0.05)
            info = c.pipe("/avoid/f.bin", b"a" * (SMALL * 2),
                          layout=LayoutSpec(chunk_size=SMALL))
            assert info.layout is not None and down not in info.layout.targets
            assert info.layout.stripe_count == 2
            assert c.status()["targets_up"] == 2
    finally:
        restart(fault, 0)
