"""Directory quotas through a real cluster, on each metadata store: the client, the HTTP
routes, ``stager quota`` and ``stager status`` (issue 28, item 3)."""

from __future__ import annotations

import asyncio
import errno
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import STORES, cluster_on_each_store, raw_http, start_cluster

from stager import Client
from stager.cli.main import main
from stager.client import AsyncClient
from stager.config import load_config
from stager.errors import Forbidden, InsufficientStorage, NotFound, QuotaExceeded
from stager.meta.store.base import NodeEntry
from stager.meta.store.postgres.db import SCHEMA_VERSION
from stager.meta.store.postgres.functions import COMMIT_FUNCTION
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.meta.store.sqlite.store import SQLiteStore
from stager.protocol.routes import route
from stager.testing import ThreadCluster
from stager.testing.metastore import commit_one, upload
from stager.testing.postgres import PostgresServer

KiB = 1024

_cluster = pytest.fixture(scope="module", params=STORES, name="cluster")(cluster_on_each_store)


@pytest.fixture(scope="module")
def client(cluster: ThreadCluster) -> Iterator[Client]:
    c = Client(cluster.meta_url, config=load_config(env={}))
    yield c
    c.close()


def use(client: Client, path: str) -> tuple[int, int]:
    [q] = [q for q in client.quotas() if q.path == path]
    return q.used_bytes, q.used_files


def test_a_write_past_the_quota_is_refused_naming_the_directory(
        cluster: ThreadCluster, client: Client, ns: str) -> None:
    client.mkdir(f"{ns}/q")
    quota = client.set_quota(f"{ns}/q", max_bytes=3 * KiB)
    assert (quota.bytes, quota.files, quota.used_bytes) == (3 * KiB, None, 0)
    client.pipe(f"{ns}/q/a", b"a" * 2 * KiB)
    with pytest.raises(QuotaExceeded) as refused:
        client.pipe(f"{ns}/q/b", b"b" * 2 * KiB)
    assert isinstance(refused.value, InsufficientStorage)      # an OSError, EDQUOT
    assert refused.value.errno == errno.EDQUOT
    assert refused.value.details == {"path": f"{ns}/q/b", "directory": f"{ns}/q",
                                     "resource": "bytes", "limit": 3 * KiB, "use": 2 * KiB}
    with pytest.raises(NotFound):
        client.stat(f"{ns}/q/b")                        # nothing of it is visible
    assert [e.path for e in client.ls(f"{ns}/q")] == [f"{ns}/q/a"]
    client.pipe(f"{ns}/q/c", b"c" * KiB)                # up to the limit: written
    assert use(client, f"{ns}/q") == (3 * KiB, 2)
    # the HTTP gateway answers 507 quota_exceeded, as JSON
    reply = raw_http(cluster.meta_url, "PUT",
                     route("gateway_put").target(path=f"{ns}/q/d"), b"d")
    assert reply.status == 507, reply.body
    assert reply.json()["error"] == "quota_exceeded"
    assert reply.json()["details"]["directory"] == f"{ns}/q"
    client.rm(f"{ns}/q/a")                              # rm frees
    assert use(client, f"{ns}/q") == (KiB, 1)
    client.pipe(f"{ns}/q/b", b"b" * 2 * KiB)
    client.mkdir(f"{ns}/out")
    client.rename(f"{ns}/q/b", f"{ns}/out/b")           # renamed out: frees
    assert use(client, f"{ns}/q") == (KiB, 1)
    client.pipe(f"{ns}/q/e", b"e" * 2 * KiB)
    assert client.cat(f"{ns}/q/e") == b"e" * 2 * KiB


def test_a_batch_write_reports_the_refused_item_in_its_place(client: Client,
                                                             ns: str) -> None:
    client.mkdir(f"{ns}/b")
    client.set_quota(f"{ns}/b", max_bytes=10 * KiB, max_files=2)
    results = client.write_many([(f"{ns}/b/1", b"1" * KiB), (f"{ns}/b/2", b"2" * KiB),
                                 (f"{ns}/b/3", b"3" * KiB), (f"{ns}/other", b"o")])
    assert [type(r).__name__ for r in results] == \
        ["FileInfo", "FileInfo", "QuotaExceeded", "FileInfo"]
    assert results[2].details["resource"] == "files"        # type: ignore[union-attr]
    assert sorted(e.path for e in client.ls(f"{ns}/b")) == [f"{ns}/b/1", f"{ns}/b/2"]
    assert use(client, f"{ns}/b") == (2 * KiB, 2)


def test_sixteen_concurrent_writers_never_pass_a_limit(cluster: ThreadCluster,
                                                       client: Client, ns: str) -> None:
    client.mkdir(f"{ns}/c")
    client.set_quota(f"{ns}/c", max_bytes=5 * 4 * KiB)

    async def writers() -> list[object]:
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            return await asyncio.gather(
                *(c.pipe(f"{ns}/c/f{i}", bytes([i]) * 4 * KiB) for i in range(16)),
                return_exceptions=True)

    results = asyncio.run(writers())
    refused = [r for r in results if isinstance(r, BaseException)]
    assert all(isinstance(r, QuotaExceeded) for r in refused), refused
    assert len(refused) == 11
    assert use(client, f"{ns}/c") == (5 * 4 * KiB, 5)
    assert len(client.ls(f"{ns}/c")) == 5


def test_a_quota_set_on_a_file_or_nowhere_is_a_clean_4xx(cluster: ThreadCluster,
                                                         client: Client, ns: str) -> None:
    client.pipe(f"{ns}/f", b"x")
    for path, status in ((f"{ns}/f", 409), (f"{ns}/missing", 404)):
        reply = raw_http(cluster.meta_url, "PUT",
                         route("set_quota").target(path=path), json.dumps(
                             {"bytes": 1}).encode(), {"Content-Type": "application/json"})
        assert reply.status == status and "error" in reply.json(), reply.body
    reply = raw_http(cluster.meta_url, "PUT",
                     route("set_quota").target(path=ns), b'{"bytes": -1}',
                     {"Content-Type": "application/json"})
    assert reply.status == 400 and reply.json()["error"] == "bad_request"


def test_the_cli_sets_lists_and_status_shows_quotas(cluster: ThreadCluster, client: Client,
                                                    ns: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    client.pipe(f"{ns}/cli/a", b"a" * 2 * KiB)
    meta = ["--meta", cluster.meta_url]
    assert main([*meta, "quota", "set", f"{ns}/cli", "--bytes", "1MiB", "--files", "10"]) == 0
    out = capsys.readouterr().out
    assert f"{ns}/cli" in out and "2.0 KiB of    1.0 MiB" in out and "1 of       10" in out
    assert main([*meta, "quota", "list"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if f"{ns}/cli" in line]
    assert len(lines) == 1 and "2.0 KiB" in lines[0]
    assert main([*meta, "quota", "list", "--json"]) == 0
    listed = {q["path"]: q for q in json.loads(capsys.readouterr().out)}
    assert listed[f"{ns}/cli"] == {"path": f"{ns}/cli", "bytes": 1 << 20, "files": 10,
                                   "used_bytes": 2 * KiB, "used_files": 1}
    status = client.status()
    assert {"path": f"{ns}/cli", "bytes": 1 << 20, "files": 10, "used_bytes": 2 * KiB,
            "used_files": 1} in status["quotas"]
    assert main([*meta, "status"]) == 0
    assert any(line.startswith("quota ") and f"{ns}/cli" in line
               for line in capsys.readouterr().out.splitlines())
    assert main([*meta, "quota", "rm", f"{ns}/cli"]) == 0
    assert f"{ns}/cli" not in {q.path for q in client.quotas()}
    assert main([*meta, "quota", "set", f"{ns}/nowhere", "--bytes", "1"]) == 1
    assert "stager: error:" in capsys.readouterr().err


async def test_a_database_of_the_schema_before_quotas_upgrades_in_place(
        postgres: PostgresServer, pg_url: str, tmp_path: Path) -> None:
    """PostgreSQL: a version-8 database (no quotas, the commit function without them)
    migrates to the current schema keeping its files; SQLite: a database file made
    without the quota tables gets them on open."""
    store = PostgreSQLStore(pg_url)
    try:
        await store.mkdir("/old", parents=False, exist_ok=False, now=1.0)
        u = upload("o1", "/old/f")
        await store.begin_uploads([u])
        assert isinstance(await commit_one(store, u.file_id, size=7, checksums=(1,)), NodeEntry)
    finally:
        store.close()
    database = pg_url.rsplit("/", 1)[1]
    postgres.sql("DROP TABLE quotas; DROP TABLE pins; DROP FUNCTION stager_commit("
                 "TEXT, BIGINT, DOUBLE PRECISION, BYTEA, DOUBLE PRECISION, TEXT);"
                 + COMMIT_FUNCTION + "; UPDATE stager_schema SET version = 8", database)
    again = PostgreSQLStore(pg_url)
    try:
        quota = await again.set_quota("/old", max_bytes=10, max_files=None)
        assert (quota.used_bytes, quota.used_files) == (7, 1)
        u = upload("o2", "/old/g")
        await again.begin_uploads([u])
        assert isinstance(await commit_one(again, u.file_id, size=4), QuotaExceeded)
    finally:
        again.close()
    assert postgres.sql("SELECT version FROM stager_schema", database) == str(SCHEMA_VERSION)

    path = tmp_path / "meta.sqlite3"
    SQLiteStore(path).close()
    with sqlite3.connect(path) as db:
        db.executescript("DROP TABLE quotas; DROP TABLE pins;")
    reopened = SQLiteStore(path)
    try:
        await reopened.mkdir("/d", parents=False, exist_ok=False, now=1.0)
        assert (await reopened.set_quota("/d", max_bytes=1, max_files=1)).used_files == 0
    finally:
        reopened.close()


def test_with_auth_quotas_and_pins_take_their_scopes_and_list_what_one_may_read(
        tmp_path_factory: pytest.TempPathFactory, slow_callbacks: object) -> None:
    c = start_cluster(tmp_path_factory.mktemp("quota-auth"), auth=True)
    try:
        def client(scopes: list[str], prefixes: tuple[str, ...] = ("/",)) -> Client:
            return Client(c.meta_url, config=load_config(env={}),
                          token=c.mint(scopes, prefixes))

        admin, writer = client(["admin"]), client(["read", "write"])
        reader, reader_a = client(["read"]), client(["read"], ("/a",))
        for d in ("/a", "/b"):
            writer.mkdir(d)
        with pytest.raises(Forbidden):
            reader.set_quota("/a", max_bytes=1)          # a read token: no quota
        with pytest.raises(Forbidden):
            writer.set_quota("/a", max_bytes=1)          # nor a write one: admin
        with pytest.raises(Forbidden):
            reader.pin("/a")                             # pinning takes write
        admin.set_quota("/a", max_bytes=1 << 20)
        admin.set_quota("/b", max_bytes=1 << 20)
        writer.pin("/a")
        writer.pin("/b")
        assert [q.path for q in reader.quotas()] == ["/a", "/b"]
        assert [q.path for q in reader_a.quotas()] == ["/a"]
        assert [p.path for p in reader_a.pins()] == ["/a"]
        # stager status shows a token only what its listings show it
        status = reader_a.status()
        assert [q["path"] for q in status["quotas"]] == ["/a"], status["quotas"]
        assert [p["path"] for p in status["pins"]] == ["/a"], status["pins"]
        assert [q["path"] for q in reader.status()["quotas"]] == ["/a", "/b"]
        with pytest.raises(Forbidden):
            reader.unpin("/a")
        writer.unpin("/a")
        for each in (admin, writer, reader, reader_a):
            each.close()
    finally:
        c.stop()
