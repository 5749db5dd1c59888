"""``stager meta migrate``: a whole namespace copied between stores, exactly; a cluster
moved from SQLite to PostgreSQL keeps serving every file from the same data servers."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import start_cluster

from stager import Client
from stager.config import load_config
from stager.errors import AlreadyExists
from stager.meta.store.base import MetaStore
from stager.meta.store.migrate import migrate, refuse_served
from stager.meta.store.multipart import MultipartRecord, PartRecord
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.meta.store.sqlite.store import SQLiteStore
from stager.protocol.authmsg import TokenInfo
from stager.protocol.manifest import Manifest, ManifestFile
from stager.protocol.models import LayoutSpec, TargetInfo
from stager.testing import ThreadCluster
from stager.testing.cachestore import attachment, cached
from stager.testing.metastore import LAYOUT, upload
from stager.testing.s3keystore import s3key


@pytest.fixture
def open_kind(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str, str], MetaStore]:
    """``open_kind(kind, name)``: a fresh store of that kind (the same one again for the
    same name)."""
    urls: dict[str, str] = {}

    def open_(kind: str, name: str) -> MetaStore:
        if kind == "sqlite":
            return SQLiteStore(tmp_path / f"{name}.sqlite3")
        if name not in urls:
            urls[name] = request.getfixturevalue("postgres").create_database()
        return PostgreSQLStore(urls[name])
    return open_


async def fill(store: MetaStore) -> None:
    """A bit of everything a store keeps, including a child whose row id is lower than
    its parent's (a directory moved into one made after it)."""
    await store.mkdir("/data", parents=False, exist_ok=False, now=1.0,
                      layout=LayoutSpec(chunk_size=1 << 16, replicas=2))
    for i in range(5):
        u = upload(f"f{i}", f"/data/old/f{i}")
        await store.begin_uploads([u])
        await store.commit_uploads([(u.file_id, 10 * i, (i,) * (i % 3), 2.0 + i,
                                     {"s3": {"etag": f'"e{i}"'}} if i == 2 else {})], now=3.0)
    await store.mkdir("/later", parents=False, exist_ok=False, now=4.0,
                      layout=LayoutSpec(stripe_count=1))
    await store.rename("/data/old", "/later/moved", overwrite=False, now=5.0)
    await store.put_manifest("/later/moved", b'{"files": []}', now=6.0)
    await store.remove("/later/moved/f0", recursive=False, now=7.0)        # garbage
    await store.begin_uploads([upload("p1", "/data/pending")])              # not copied
    await store.upsert_target(TargetInfo("t0", "n0", "http://127.0.0.1:1", capacity=10))
    await store.put_token(TokenInfo("a" * 32, "ops", ("admin",), ("/",), 10, 100))
    await store.revoke_token("a" * 32, now=50)
    await store.put_s3_keys([s3key("a"), s3key("b", created=200), s3key("c", created=300)])
    await store.set_quota("/later", max_bytes=1 << 20, max_files=None)
    await store.pin("/later/moved", expires=None, now=8.0)
    f3 = (await store.stat("/later/moved/f3")).file_id
    assert f3 is not None
    await store.put_attachment(attachment("/later/moved", hits=4, misses=2))
    await store.put_cached_files([cached(f3, "/later/moved", "f3")])
    assert await store.take_fill(f3, 0, "s1", until=20.0, now=10.0)
    assert await store.record_fill(f3, 0, size=30, crc=1, now=10.0)


async def everything(store: MetaStore) -> dict[str, Any]:
    return {"entries": await store.dump_entries(after=0, limit=10_000),
            "manifests": await store.dump_manifests(after=0, limit=10_000),
            "targets": await store.list_targets(), "tokens": await store.list_tokens(),
            "s3_keys": await store.list_s3_keys(),
            "quotas": await store.list_quotas(), "pins": await store.pins(0.0),
            "attachments": await store.attachments(),
            "cached_files": await store.cached_files("/later/moved"),
            "counts": await store.counts()}


@pytest.mark.parametrize("kinds", [("sqlite", "postgresql"), ("postgresql", "sqlite"),
                                   ("sqlite", "sqlite")], ids="->".join)
async def test_a_store_is_copied_exactly(open_kind: Callable[[str, str], MetaStore],
                                         kinds: tuple[str, str]) -> None:
    source, target = open_kind(kinds[0], "source"), open_kind(kinds[1], "target")
    try:
        await fill(source)
        report = await migrate(source, target, page=2)       # small pages: paging is used
        assert report.to_json() == {"directories": 4, "files": 4, "bytes": 100,
                                    "manifests": 1, "targets": 1, "tokens": 1, "s3_keys": 3,
                                    "quotas": 1,
                                    "pins": 1, "attachments": 1, "cached_files": 1,
                                    "garbage": 1, "uploads_dropped": 1,
                                    "multipart_uploads": 0}
        assert await everything(target) == await everything(source)
        assert await source.cache_usage() == {"/later/moved": (1, 30, 1, 30)}
        assert await target.cache_usage() == {"/later/moved": (1, 30, 0, 0)}   # cold
        f2 = await target.stat("/later/moved/f2")
        assert (f2.checksums, f2.attrs) == ((2, 2), {"s3": {"etag": '"e2"'}})
        assert (await target.stat("/later/moved/f1")).attrs == {}
        # the removed file and the pending upload both wait to be purged
        garbage = {g.file_id[:2] for g in await target.take_garbage(10)}
        assert garbage == {"f0", "p1"}
        assert await target.expired_uploads(math.inf) == []
        # the copy is a working store: new rows get fresh ids
        await target.mkdir("/later/new", parents=False, exist_ok=False, now=8.0)
        assert (await target.stat("/later/new")).is_dir

        with pytest.raises(AlreadyExists, match="target metadata store is not empty"):
            await migrate(source, target)
    finally:
        source.close()
        target.close()


@pytest.mark.parametrize("kinds", [("sqlite", "postgresql"), ("sqlite", "sqlite")],
                         ids="->".join)
async def test_multipart_uploads_in_progress_are_copied(
        open_kind: Callable[[str, str], MetaStore], kinds: tuple[str, str]) -> None:
    """An S3 client's upload in progress goes on on the new store: its record, its parts
    (one in the final file's chunks, one hidden) and its pending final file; a plain
    upload in progress beside it is still dropped, as garbage."""
    source, target = open_kind(kinds[0], "source"), open_kind(kinds[1], "target")
    try:
        await source.mkdir("/bkt", parents=False, exist_ok=False, now=1.0)
        final = upload("m1", "/bkt/obj")
        await source.begin_uploads([final, upload("p1", "/bkt/plain")])
        record = MultipartRecord("u" * 32, "/bkt/obj", final.file_id, LAYOUT, 1 << 20,
                                 2.0, 2.0, '{"etag": ""}')
        await source.begin_multipart(record)
        parts = [PartRecord(1, final.file_id, 0, 1 << 20, "a" * 32, (1,), 3.0),
                 PartRecord(2, "h" * 32, 0, 5, "b" * 32, (2,), 4.0, LAYOUT)]
        for part in parts:
            assert await source.put_part(record.upload_id, part)
        report = await migrate(source, target)
        assert (report.multipart_uploads, report.uploads_dropped) == (1, 1)
        got = await target.get_multipart(record.upload_id)
        assert (got.path, got.file_id, got.part_size, got.extra) == \
            (record.path, record.file_id, 1 << 20, record.extra)
        assert await target.list_parts(record.upload_id) == parts
        assert await target.get_uploads([final.file_id]) == [final]
        assert await target.list_multipart("/bkt/", after=("", ""), limit=10) == [got]
        garbage = {g.file_id[:2] for g in await target.take_garbage(10)}
        assert garbage == {"p1"}        # not the final file, not the hidden part
    finally:
        source.close()
        target.close()


def stager(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
    return subprocess.run([sys.executable, "-m", "stager", *args], capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.fixture
def sqlite_cluster(tmp_path: Path, slow_callbacks) -> Iterator[ThreadCluster]:  # type: ignore[no-untyped-def]
    c = start_cluster(tmp_path / "cluster", 3)
    yield c
    c.stop()


def test_a_cluster_moves_from_sqlite_to_postgresql(sqlite_cluster: ThreadCluster,
                                                    pg_url: str, payload) -> None:
    """Files, directories with layouts and a manifest on SQLite; the metadata server
    stopped, the namespace migrated, a metadata server on PostgreSQL started with the
    same data servers: fsck is clean and every file reads back byte-exact."""
    c = sqlite_cluster
    written: dict[str, bytes] = {}
    with Client(c.meta_url, config=load_config(env={})) as client:
        client.mkdir("/ds/small", layout=LayoutSpec(chunk_size=64 * 1024, stripe_count=2))
        client.mkdir("/ds/wide", layout=LayoutSpec(chunk_size=128 * 1024, replicas=2))
        for i, size in enumerate([0, 1, 64 * 1024, 200_000, 1 << 20]):
            for d in ("small", "wide"):
                written[f"/ds/{d}/f{i}.bin"] = payload(size + i)
        written["/top.bin"] = payload(5 << 20)                    # the default layout
        for path, data in written.items():
            client.pipe(path, data)
        client.rm("/top.bin")                                     # garbage, to be purged
        del written["/top.bin"]
        entries = sorted(client.walk("/ds/small"), key=lambda e: e.path)
        client.put_manifest(Manifest("/ds/small", tuple(
            ManifestFile(e.path[len("/ds/small/"):], e.size, e.mtime, e.file_id or "")
            for e in entries), source="test", created=1.0))
        before = {p: client.stat(p, cached=False) for p in written}

    port = urlsplit(c.meta_url).port
    assert port is not None
    # refused while its metadata server runs (it holds ROOT/meta.lock): nothing copied
    served = stager("meta", "migrate", "--from", f"sqlite:{c.root / 'meta'}", "--to", pg_url)
    assert served.returncode == 1, served.stdout
    assert f"a metadata server (pid {os.getpid()}) is serving" in served.stderr, served.stderr
    c.stop_meta()
    moved = stager("meta", "migrate", "--from", f"sqlite:{c.root / 'meta'}", "--to", pg_url,
                   "--json")
    assert moved.returncode == 0, moved.stderr
    report = json.loads(moved.stdout)
    assert report["files"] == len(written) and report["manifests"] == 1
    assert report["directories"] == 4 and report["targets"] == 3
    assert report["bytes"] == sum(len(d) for d in written.values())

    c.config = c.config.replace(meta_store=pg_url)
    c.start_meta(port)                    # the data servers heartbeat to the same port
    c.wait_targets(3)
    with Client(c.meta_url, config=load_config(env={})) as client:
        for path, data in written.items():
            info = client.stat(path, cached=False)
            assert (info.size, info.file_id, info.layout) == (
                before[path].size, before[path].file_id, before[path].layout)
            assert client.cat(path) == data, path
        assert client.stat("/ds/wide", cached=False).default_layout == LayoutSpec(
            chunk_size=128 * 1024, replicas=2)
        manifest = client.get_manifest("/ds/small")
        assert manifest is not None and len(manifest.files) == 5
        client.pipe("/ds/after.bin", b"written on PostgreSQL")          # a new file id row
        assert client.cat("/ds/after.bin") == b"written on PostgreSQL"
    fsck = stager("--meta", c.meta_url, "fsck", "--json")
    result = json.loads(fsck.stdout)
    assert fsck.returncode == 0 and result["clean"], fsck.stdout
    assert result["missing"] == 0 and result["files"] == len(written) + 1
    # the migration refuses to copy into the store now in use
    again = stager("meta", "migrate", "--from", f"sqlite:{c.root / 'meta'}", "--to", pg_url)
    assert again.returncode == 1 and "not empty" in again.stderr


def test_a_postgresql_store_being_served_is_not_migrated(tmp_path: Path, pg_url: str,
                                                          slow_callbacks) -> None:  # type: ignore[no-untyped-def]
    """Issue 26: the docs said to stop the source's metadata server; nothing checked.
    A metadata server on the PostgreSQL source records itself and holds the duty
    lock: the migration is refused, and runs once the server has stopped."""
    c = start_cluster(tmp_path / "cluster", 1, meta_store=pg_url)
    try:
        with Client(c.meta_url, config=load_config(env={})) as client:
            client.pipe("/kept.bin", b"kept")
        to = f"sqlite:{tmp_path / 'copy.sqlite3'}"
        served = stager("meta", "migrate", "--from", pg_url, "--to", to)
        assert served.returncode == 1, served.stdout
        assert f"metadata servers are serving the source store: {c.meta_url}" in served.stderr
        c.stop_meta()                   # (the copy below needs `to` empty: nothing copied)
        moved = stager("meta", "migrate", "--from", pg_url, "--to", to, "--json")
        assert moved.returncode == 0, moved.stderr
        assert json.loads(moved.stdout)["files"] == 1
    finally:
        c.stop()


async def test_the_duty_lock_alone_refuses_too(pg_url: str) -> None:
    """A server that holds the duties but has not recorded itself (yet) counts."""
    server, source = PostgreSQLStore(pg_url), PostgreSQLStore(pg_url)
    try:
        assert await server.hold_duties()
        with pytest.raises(FileExistsError, match="duty lock"):
            await refuse_served(source)
        server.close()
        for _ in range(100):            # PostgreSQL frees the lock once it sees the close
            try:
                await refuse_served(source)
                break
            except FileExistsError:
                await asyncio.sleep(0.05)
        await refuse_served(source)
    finally:
        server.close()
        source.close()
