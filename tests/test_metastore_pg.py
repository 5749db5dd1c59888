"""What only the PostgreSQL store has: a versioned schema, conflicts retried, a
database that goes away and comes back, and a real metadata server on it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import start_cluster

from stager import Client
from stager.config import load_config
from stager.errors import AlreadyExists, InternalError, NotFound, Unavailable, UploadNotFound
from stager.meta.store.base import NodeEntry
from stager.meta.store.postgres.db import SCHEMA_VERSION
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.testing import ThreadCluster
from stager.testing.cachestore import attachment, cached
from stager.testing.metastore import commit_one, upload
from stager.testing.postgres import PostgresServer


async def put(store: PostgreSQLStore, file_id: str, path: str) -> str:
    u = upload(file_id, path)
    await store.begin_uploads([u])
    assert isinstance(await commit_one(store, u.file_id, size=3, checksums=(1,)), NodeEntry)
    return u.file_id


async def test_the_schema_is_versioned_and_a_newer_one_refused(
        postgres: PostgresServer, pg_url: str) -> None:
    store = PostgreSQLStore(pg_url)
    try:
        await store.mkdir("/kept", parents=False, exist_ok=False, now=1.0)
    finally:
        store.close()
    database = pg_url.rsplit("/", 1)[1]
    assert postgres.sql("SELECT version FROM stager_schema", database) == str(SCHEMA_VERSION)
    reopened = PostgreSQLStore(pg_url)           # the same version: opened as it is
    try:
        assert (await reopened.stat("/kept")).is_dir
    finally:
        reopened.close()
    postgres.sql(f"UPDATE stager_schema SET version = {SCHEMA_VERSION + 1}", database)
    newer = PostgreSQLStore(pg_url)
    try:
        with pytest.raises(InternalError, match=f"schema version {SCHEMA_VERSION + 1}, "
                                                f"newer than this stager's {SCHEMA_VERSION}"):
            await newer.stat("/kept")
    finally:
        newer.close()


async def test_a_schema_9_database_gets_the_cache_tables(postgres: PostgresServer,
                                                         pg_url: str) -> None:
    """Migration 10 on a database made before the managed cache: its data kept."""
    store = PostgreSQLStore(pg_url)
    try:
        file_id = await put(store, "m1", "/old/f")
    finally:
        store.close()
    database = pg_url.rsplit("/", 1)[1]
    postgres.sql("DROP TABLE attachments; DROP TABLE cached_files; DROP TABLE cache_chunks; "
                 "UPDATE stager_schema SET version = 9", database)
    again = PostgreSQLStore(pg_url)
    try:
        assert (await again.stat("/old/f")).file_id == file_id
        await again.put_attachment(attachment("/old"))
        await again.put_cached_files([cached(file_id, "/old", "f")])
        assert await again.take_fill(file_id, 0, "s1", until=2.0, now=1.0)
        assert await again.record_fill(file_id, 0, size=3, crc=9, now=1.0)
        assert await again.cache_usage() == {"/old": (1, 3, 1, 3)}
    finally:
        again.close()
    assert postgres.sql("SELECT version FROM stager_schema", database) == str(SCHEMA_VERSION)


async def test_a_schema_12_database_gets_file_attrs(pg_url: str) -> None:
    """Migration 13 on a database made before file versions had attributes: its files
    kept (with none), its commit function replaced by the one that sets them."""
    import asyncpg

    from stager.meta.store.postgres.functions import QUOTA_COMMIT_FUNCTION

    store = PostgreSQLStore(pg_url)
    try:
        file_id = await put(store, "m1", "/old/f")
    finally:
        store.close()
    conn = await asyncpg.connect(pg_url)
    try:    # back to schema 12: no column, migration 9's commit function
        await conn.execute("DROP FUNCTION stager_commit(TEXT, BIGINT, DOUBLE PRECISION, BYTEA, "
                           "DOUBLE PRECISION, TEXT); ALTER TABLE entries DROP COLUMN attrs; "
                           "UPDATE stager_schema SET version = 12; "
                           + QUOTA_COMMIT_FUNCTION.split("\n", 2)[2])
    finally:
        await conn.close()
    again = PostgreSQLStore(pg_url)
    try:
        old = await again.stat("/old/f")
        assert (old.file_id, old.attrs) == (file_id, {})
        u = upload("m2", "/old/g")
        await again.begin_uploads([u])
        await again.commit_uploads([(u.file_id, 0, (), 1.0, {"s3": {"etag": '"x"'}})], now=1.0)
        assert (await again.stat("/old/g")).attrs == {"s3": {"etag": '"x"'}}
    finally:
        again.close()


async def test_queued_writes_share_one_transaction_and_fail_alone(pg_url: str) -> None:
    store = PostgreSQLStore(pg_url)
    try:
        await put(store, "t0", "/g/taken")
        fresh = [upload(f"g{i:02d}", f"/g/f{i}") for i in range(20)]
        clash = upload("c0", "/g/taken", overwrite=False)
        await store.begin_uploads([*fresh, clash])
        before = store.writes.groups
        results = await asyncio.gather(
            *(commit_one(store, u.file_id) for u in [*fresh[:10], clash, *fresh[10:]]),
            commit_one(store, "0" * 32))
        assert store.writes.groups == before + 1 and store.writes.grouped_calls >= 22
        assert isinstance(results[10], AlreadyExists)
        assert isinstance(results[-1], UploadNotFound)
        assert [r.path for r in results[:10] + results[11:-1]] == [  # type: ignore[union-attr]
            f"/g/f{i}" for i in range(20)]
        assert await store.get_uploads([clash.file_id]) == [clash]         # still pending
        assert len(await store.list_dir("/g", after="", limit=100)) == 21
    finally:
        store.close()


async def test_a_serialization_conflict_is_retried(pg_url: str) -> None:
    """Two transactions read the same row, then both update it: PostgreSQL aborts one
    (SERIALIZABLE), which runs again and sees the other's write."""
    store = PostgreSQLStore(pg_url)
    try:
        await store.mkdir("/d", parents=False, exist_ok=False, now=0.0)
        both_read = asyncio.Barrier(2)
        attempts = []

        async def bump(conn) -> None:  # type: ignore[no-untyped-def]
            attempts.append(1)
            mtime = await conn.fetchval(
                "SELECT mtime FROM entries WHERE parent = 1 AND name = 'd'")
            if len(attempts) <= 2:           # the first attempts wait for each other
                await both_read.wait()
            await conn.execute("UPDATE entries SET mtime = $1 WHERE parent = 1 AND name = 'd'",
                               mtime + 1)

        await asyncio.gather(store.db.write(bump), store.db.write(bump))
        assert store.db.conflicts >= 1 and len(attempts) >= 3
        assert (await store.stat("/d")).mtime == 2.0          # no update lost

        # Many directories made at once in one parent: each touches the parent's row.
        made = await asyncio.gather(*(store.mkdir(f"/d/{i}", parents=False, exist_ok=False,
                                                  now=3.0) for i in range(16)))
        assert len(made) == 16
        assert len(await store.list_dir("/d", after="", limit=100)) == 16
    finally:
        store.close()


async def test_a_database_down_is_unavailable_and_the_store_recovers(
        postgres: PostgresServer, pg_url: str) -> None:
    store = PostgreSQLStore(pg_url, connect_timeout=2.0)
    try:
        kept = await put(store, "k1", "/kept")
        pending = upload("p1", "/pending")
        await store.begin_uploads([pending])
        await asyncio.to_thread(postgres.stop)
        try:
            with pytest.raises(Unavailable, match="metadata database is unavailable"):
                await store.stat("/kept")
            with pytest.raises(Unavailable):
                await commit_one(store, pending.file_id)
            with pytest.raises(Unavailable):
                await store.mkdir("/new", parents=False, exist_ok=False, now=1.0)
        finally:
            await asyncio.to_thread(postgres.start)
        # The same store, not reopened: its pool reconnects.
        assert (await store.stat("/kept")).file_id == kept
        assert isinstance(await commit_one(store, pending.file_id), NodeEntry)
        assert (await store.stat("/pending")).size == 0
        await store.mkdir("/new", parents=False, exist_ok=False, now=1.0)
    finally:
        store.close()


@pytest.fixture
def pg_cluster(tmp_path: Path, pg_url: str, slow_callbacks) -> Iterator[ThreadCluster]:  # type: ignore[no-untyped-def]
    c = start_cluster(tmp_path / "cluster", 2, meta_store=pg_url)
    yield c
    c.stop()


def test_a_metadata_server_on_postgresql(pg_cluster: ThreadCluster,
                                         postgres: PostgresServer) -> None:
    """Files round-trip through the client; the namespace outlives the metadata server;
    a database outage is a 503 and the server recovers on its own."""
    client = Client(pg_cluster.meta_url, config=load_config(env={}))
    try:
        data = bytes(range(256)) * 4096                   # 1 MiB
        client.pipe("/ds/a.bin", data)
        client.pipe("/ds/b.bin", b"small")
        assert client.cat("/ds/a.bin") == data
        client.rename("/ds/b.bin", "/ds/c.bin")
        assert [e.path for e in client.ls("/ds")] == ["/ds/a.bin", "/ds/c.bin"]
    finally:
        client.close()

    port = urlsplit(pg_cluster.meta_url).port
    assert port is not None
    pg_cluster.stop_meta()                                 # nothing kept in the server
    shutil.rmtree(pg_cluster.root / "meta")
    pg_cluster.start_meta(port)
    client = Client(pg_cluster.meta_url, config=load_config({"retries": 0}, env={}))
    try:
        assert client.cat("/ds/c.bin") == b"small"
        postgres.stop()
        try:
            with pytest.raises(Unavailable, match="metadata database is unavailable"):
                client.stat("/ds/a.bin", cached=False)
        finally:
            postgres.start()
        assert client.cat("/ds/a.bin") == data              # the same server, recovered
        client.pipe("/ds/d.bin", b"after")
        client.rm("/ds", recursive=True)
        with pytest.raises(NotFound):
            client.stat("/ds/a.bin", cached=False)
    finally:
        client.close()


def test_stager_meta_store_flag_and_environment(tmp_path: Path, postgres: PostgresServer,
                                                pg_url: str) -> None:
    """`stager meta --store URL` serves the namespace from PostgreSQL; STAGER_META_STORE
    says the same; a database with a newer schema is refused at start, saying why."""
    def serve(*flags: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        ready = tmp_path / "ready.json"
        ready.unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, "-m", "stager", "meta", "--root",
                                 str(tmp_path / "m"), "--port", "0", "--ready-file",
                                 str(ready), *flags], env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 30
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"stager meta {' '.join(flags)} did not start")
            time.sleep(0.05)
        proc.url = json.loads(ready.read_text())["url"]  # type: ignore[attr-defined]
        return proc

    meta = serve("--store", pg_url)
    try:
        with Client(meta.url, config=load_config(env={})) as c:  # type: ignore[attr-defined]
            c.mkdir("/from-flag")
    finally:
        meta.terminate()
        assert meta.wait(30) == 0
    meta = serve(env={"STAGER_META_STORE": pg_url})
    try:
        with Client(meta.url, config=load_config(env={})) as c:  # type: ignore[attr-defined]
            assert [e.path for e in c.ls("/")] == ["/from-flag"]
    finally:
        meta.terminate()
        assert meta.wait(30) == 0
    postgres.sql(f"UPDATE stager_schema SET version = {SCHEMA_VERSION + 1}",
                 pg_url.rsplit("/", 1)[1])
    refused = subprocess.run([sys.executable, "-m", "stager", "meta", "--root",
                              str(tmp_path / "m"), "--port", "0", "--store", pg_url],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0
    assert f"has schema version {SCHEMA_VERSION + 1}, newer than" in refused.stderr
