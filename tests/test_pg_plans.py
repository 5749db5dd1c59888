"""PostgreSQL schema 19 (stager/meta/store/postgres/plans.py): the put's and the commit's
functions keep their statements' generic plans instead of planning them on every call,
and ``stager_spec_fields`` answers as migration 18's did while keeping its plan."""

from __future__ import annotations

import asyncpg
import pytest
from test_pg_joined_put import _together
from test_spec_put import _hinted

from stager.meta.store.postgres.functions import SPEC_PUT_FUNCTION
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.meta.store.spec import SpecChanged
from stager.protocol.models import LayoutSpec

_SETTINGS = """
SELECT p.proname, p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql'),
       COALESCE(p.proconfig, '{}')
FROM pg_proc p WHERE p.proname IN ('stager_put', 'stager_commit', 'stager_spec_fields')
ORDER BY p.proname"""

_GENERIC = ["plan_cache_mode=force_generic_plan"]


async def _settings(url: str) -> list[tuple[str, bool, list[str]]]:
    store = PostgreSQLStore(url, pool_size=1)
    try:
        await store.mkdir("/d", parents=False, exist_ok=True, now=1.0)     # migrates
        rows = await store.db.read(lambda c: c.fetch(_SETTINGS))
        return [(r[0], r[1], list(r[2])) for r in rows]
    finally:
        store.close()


async def test_the_put_and_the_commit_keep_generic_plans(pg_url: str) -> None:
    """stager_put and stager_commit run with generic plans (a custom plan was made on
    every call for their ``= ANY(chain)`` statements), and stager_spec_fields is
    PL/pgSQL (a SQL function with a sub-select planned its body on every call); a
    database set back to 17 runs 18 again, which drops the SET, and 19 sets it again."""
    expected = [("stager_commit", True, _GENERIC), ("stager_put", True, _GENERIC),
                ("stager_spec_fields", True, [])]
    assert await _settings(pg_url) == expected
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("UPDATE stager_schema SET version = 17")
    finally:
        await conn.close()
    assert await _settings(pg_url) == expected


_LAYOUTS = [None, "", "[]", '"text"', "{}", '{"chunk_size": 1048576}',
            '{"chunk_size": 4, "stripe_count": 2, "replicas": null, "targets": ["t"]}',
            '{"replicas": 3, "stripe_count": null, "cached": true}']


async def test_spec_fields_answers_as_migration_18s(pg_url: str) -> None:
    """The PL/pgSQL stager_spec_fields gives migration 18's SQL function's answer for
    every kind of layout a directory row holds, and the same error for one that is not
    JSON."""
    await _settings(pg_url)
    start = SPEC_PUT_FUNCTION.index("CREATE OR REPLACE FUNCTION stager_spec_fields(")
    old = SPEC_PUT_FUNCTION[start:SPEC_PUT_FUNCTION.index("$fn$;", start) + len("$fn$;")]
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(old.replace("stager_spec_fields(", "spec_fields_18("))
        for layout in _LAYOUTS:
            new = await conn.fetchval("SELECT stager_spec_fields($1)::text", layout)
            assert new == await conn.fetchval("SELECT spec_fields_18($1)::text", layout)
        for name in ("stager_spec_fields", "spec_fields_18"):
            with pytest.raises(asyncpg.InvalidTextRepresentationError):
                await conn.fetchval(f"SELECT {name}($1)", "{not json")
    finally:
        await conn.close()


async def test_a_put_in_a_directory_with_a_layout_is_checked_as_before(pg_url: str) -> None:
    """The spec walk with the new stager_spec_fields: a directory's own layout is merged
    over its parent's (the nearest wins field by field), as schema 18 did."""
    store = PostgreSQLStore(pg_url, pool_size=1)
    try:
        await store.mkdir("/a", parents=False, exist_ok=False, now=1.0)
        await store.set_layout("/a", LayoutSpec(replicas=1, chunk_size=1 << 20))
        await store.mkdir("/a/b", parents=False, exist_ok=False, now=1.0)
        await store.set_layout("/a/b", LayoutSpec(chunk_size=1 << 21))
        want = LayoutSpec(replicas=1, chunk_size=1 << 21)
        _, wrong = await _together(store, _hinted("w0", "/a/b/f", LayoutSpec()))
        assert isinstance(wrong, SpecChanged) and wrong.spec == want
        _, entry = await _together(store, _hinted("w1", "/a/b/f", want))
        assert not isinstance(entry, Exception) and entry.path == "/a/b/f"
    finally:
        store.close()
