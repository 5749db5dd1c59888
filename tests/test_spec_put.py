"""A small gateway PUT without a separate check of its path (issue 30): planned with the
layout spec its server last saw for the directory, checked by the store in the put
itself (PostgreSQL's ``stager_put`` since schema 18, SQLite's joined put), and written
once more where the directory's spec changed since."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from test_pg_joined_put import _together, _upload
from test_pg_roundtrips import on_both_stores

from stager import Client
from stager.errors import IsADirectory, NotADirectory, StagerError
from stager.meta.http.app import SERVICE
from stager.meta.store.base import MetaStore, Upload
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.meta.store.spec import SpecChanged
from stager.protocol.models import LayoutSpec
from stager.testing import ThreadCluster

MiB = 1 << 20


async def _expire(store: PostgreSQLStore) -> None:
    """Connections made from now on trace their statements (Database.trace)."""
    for serializable in (False, True):
        pool: asyncpg.Pool = await store.db.pool(serializable)
        await pool.expire_connections()


def _puts(seen: list[str]) -> list[str]:
    """The statements of a put's path among those of the server's duties (collection
    and the like): a check's walk, an upload's record, a commit, a joined put."""
    return [q for q in seen if re.search(
        r"WITH RECURSIVE walk|INTO uploads|stager_(reserve|commit|put)\(", q)]


def test_a_small_put_on_postgresql_is_one_statement(pg_url: str, tmp_path: Path,
                                                    ns: str) -> None:
    """0 B and 1 KiB PUTs each send one statement that names the path (stager_put), no
    walk of a check before it (two at schema 17: the check's walk, then the put); a
    directory given its own layout after its spec was learnt gets files of that layout
    (the put answers 'spec', the server plans and writes again), and the next put there
    is one statement again."""
    with ThreadCluster(tmp_path, data_servers=1, meta_store=pg_url) as cluster:
        assert cluster.meta is not None
        store = cluster.meta.app[SERVICE].store
        assert isinstance(store, PostgreSQLStore)
        client = Client(cluster.meta_url)
        try:
            client.pipe(f"{ns}/warm", b"w")
            seen: list[str] = []
            store.db.trace = seen
            cluster.call(_expire(store))
            for name, data in (("e", b""), ("s", b"s" * 1024)):
                del seen[:]
                client.pipe(f"{ns}/{name}", data)
                assert len(_puts(seen)) == 1 and "stager_put(" in _puts(seen)[0], seen
                assert client.cat(f"{ns}/{name}") == data
            client.set_layout(ns, LayoutSpec(chunk_size=MiB))
            del seen[:]
            client.pipe(f"{ns}/after", b"a" * 10)
            assert client.stat(f"{ns}/after").layout.chunk_size == MiB
            assert client.cat(f"{ns}/after") == b"a" * 10
            assert len([q for q in _puts(seen) if "stager_put(" in q]) == 2, seen
            del seen[:]
            client.pipe(f"{ns}/next", b"n")
            assert len(_puts(seen)) == 1 and client.stat(f"{ns}/next").layout.chunk_size == MiB
            assert cluster.call(store.expired_uploads(float("inf"))) == []
        finally:
            store.db.trace = None
            client.close()


@pytest.mark.parametrize("on_pg", [False, True], ids=["sqlite", "postgresql"])
def test_a_small_put_answers_as_its_check_did(request: pytest.FixtureRequest, tmp_path: Path,
                                              ns: str, on_pg: bool) -> None:
    """On each store: a directory's spec set after this server learnt it is followed
    (field by field over its parent's); a file in the way of a parent, a directory in
    the way of the file, answer the errors the check answered; an existing file is
    replaced; missing parents are made; nothing is left pending."""
    store_url = request.getfixturevalue("pg_url") if on_pg else ""
    with ThreadCluster(tmp_path, data_servers=2, meta_store=store_url) as cluster:
        assert cluster.meta is not None
        store = cluster.meta.app[SERVICE].store
        client = Client(cluster.meta_url)
        try:
            client.pipe(f"{ns}/d/first", b"1")
            client.set_layout(ns, LayoutSpec(replicas=2))
            client.set_layout(f"{ns}/d", LayoutSpec(chunk_size=2 * MiB))
            client.pipe(f"{ns}/d/second", b"2" * 100)
            layout = client.stat(f"{ns}/d/second").layout
            assert (layout.chunk_size, layout.replicas) == (2 * MiB, 2)
            assert client.cat(f"{ns}/d/second") == b"2" * 100
            client.pipe(f"{ns}/d/second", b"again")
            assert client.cat(f"{ns}/d/second") == b"again"
            client.pipe(f"{ns}/new/a/b/c", b"deep")
            assert client.cat(f"{ns}/new/a/b/c") == b"deep"
            with pytest.raises(NotADirectory):
                client.pipe(f"{ns}/d/second/x", b"x")
            with pytest.raises(NotADirectory):
                client.pipe(f"{ns}/d/second/x/y", b"x")
            with pytest.raises(IsADirectory):
                client.pipe(f"{ns}/d", b"x")
            assert cluster.call(store.expired_uploads(float("inf"))) == []
        finally:
            client.close()


def _hinted(file_id: str, path: str, spec: LayoutSpec, **kw: Any) -> Upload:
    return replace(_upload(file_id, path, **kw), spec=spec)


async def _outcomes(store: MetaStore) -> list[Any]:
    """Puts planned without a check, each way one can fail (as its check did), then
    ones that succeed; a wrong spec leaves nothing, another refusal a pending upload."""
    await store.mkdir("/d", parents=False, exist_ok=False, now=1.0)
    await store.set_layout("/d", LayoutSpec(chunk_size=MiB))
    await _together(store, _upload("f", "/f"))
    spec = LayoutSpec(chunk_size=MiB)
    cases = [_hinted("x0", "/d/a", LayoutSpec()), _hinted("x1", "/f/x", LayoutSpec()),
             _hinted("x2", "/f/x/y", LayoutSpec()), _hinted("x3", "/d", LayoutSpec()),
             _hinted("x4", "/f", LayoutSpec(), overwrite=False),
             _hinted("x5", "/m/n/o", LayoutSpec(), parents=False),
             _hinted("x6", "/d/a", spec), _hinted("x7", "/d/new/b", spec),
             _hinted("x8", "/f", LayoutSpec())]
    out: list[Any] = []
    for u in cases:
        begun, entry = await _together(store, u, 2, (3,))
        if isinstance(entry, StagerError):
            pending = await store.get_uploads([u.file_id]) == [u]
            assert pending != isinstance(entry, SpecChanged)
            out.append((begun, type(entry).__name__, entry.message, entry.details))
        else:
            out.append((begun, "ok", entry.path, entry.size, entry.checksums))
    return out


async def test_a_put_planned_without_a_check_answers_alike_on_both_stores(
        pg_url: str, tmp_path: Path) -> None:
    sqlite, pg = await on_both_stores(pg_url, tmp_path, _outcomes)
    assert sqlite == pg, (sqlite, pg)
    assert [o[1] for o in pg] == [
        "SpecChanged", "NotADirectory", "NotADirectory", "IsADirectory", "AlreadyExists",
        "NotFound", "ok", "ok", "ok"]


async def test_a_database_set_back_to_schema_16_gets_the_checking_put(pg_url: str) -> None:
    """Migration 18 runs again over its own result and over migration 17's stager_put
    (run again from further back): one stager_put, which checks the spec."""
    store = PostgreSQLStore(pg_url, pool_size=1)
    try:
        await store.mkdir("/m", parents=False, exist_ok=False, now=1.0)
        await store.set_layout("/m", LayoutSpec(replicas=1))
    finally:
        store.close()
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("UPDATE stager_schema SET version = 16")
    finally:
        await conn.close()
    again = PostgreSQLStore(pg_url, pool_size=1)
    try:
        _, wrong = await _together(again, _hinted("m0", "/m/f", LayoutSpec()))
        assert isinstance(wrong, SpecChanged) and wrong.spec == LayoutSpec(replicas=1)
        _, entry = await _together(again, _hinted("m1", "/m/f", LayoutSpec(replicas=1)))
        assert not isinstance(entry, Exception) and entry.path == "/m/f"
        assert await again.db.read(lambda c: c.fetchval(
            "SELECT count(*) FROM pg_proc WHERE proname = 'stager_put'")) == 1
    finally:
        again.close()
