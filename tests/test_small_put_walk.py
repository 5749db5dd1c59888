"""A small PUT on SQLite walks its path once (issue 30): the joined put
(``SQLiteStore.put_upload``) checks the path of an upload planned without a check,
then commits it, in one transaction; the commit takes the directory and the row the
check found instead of walking the path again (six lookups of a component for a
file two directories down before, three now).  What it answers is unchanged.  Its
transaction walks up to bump the manifests above it only where there is a manifest."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from stager.errors import AlreadyExists, IsADirectory, NotFound
from stager.meta.store.sqlite.store import SQLiteStore
from stager.protocol.models import LayoutSpec
from stager.testing.metastore import upload

# a lookup of one path component (as traced: its parameters filled in)
LOOKUP = re.compile(r"FROM entries WHERE parent = \S+ AND name = ")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "meta.db")
    yield s
    s.close()


async def put(store: SQLiteStore, file_id: str, path: str, *, overwrite: bool = True,
              parents: bool = True, seen: list[str] | None = None) -> tuple[object, int]:
    """The joined put of a 1-byte file at ``path`` planned without a check (its spec
    the default): what it answers, and the lookups of a path component it made."""
    planned = upload(file_id, path, overwrite=overwrite)
    planned = type(planned)(planned.file_id, path, planned.layout, overwrite, parents,
                            planned.created, spec=LayoutSpec())
    seen = [] if seen is None else seen
    store.database.db.set_trace_callback(seen.append)
    try:
        got = await store.thread.write(store.put_upload, planned,
                                       (planned.file_id, 1, (7,), 1.0, {}), 1.0)
    finally:
        store.database.db.set_trace_callback(None)
    return got, sum(bool(LOOKUP.search(q)) for q in seen)


async def test_a_put_walks_its_path_once(store: SQLiteStore) -> None:
    await store.mkdir("/a/b", parents=True, exist_ok=False, now=1.0)
    got, lookups = await put(store, "f1", "/a/b/f")
    assert getattr(got, "path", None) == "/a/b/f", got
    assert lookups == 3          # a, b, then f: by the check; the commit walks nothing
    assert (await store.stat("/a/b/f")).size == 1
    assert not await store.expired_uploads(float("inf"))     # no pending row


async def test_a_put_answers_as_before(store: SQLiteStore) -> None:
    await store.mkdir("/d/sub", parents=True, exist_ok=False, now=1.0)
    got, _ = await put(store, "f1", "/d/f")
    assert getattr(got, "file_id", None) == "f1".ljust(32, "0"), got
    replaced, _ = await put(store, "f2", "/d/f")            # overwrite: the new file
    assert getattr(replaced, "file_id", None) == "f2".ljust(32, "0"), replaced
    assert isinstance((await put(store, "f3", "/d/f", overwrite=False))[0], AlreadyExists)
    assert isinstance((await put(store, "f4", "/d/sub"))[0], IsADirectory)
    assert isinstance((await put(store, "f5", "/new/f", parents=False))[0], NotFound)
    made, lookups = await put(store, "f6", "/new/deeper/f")  # its directories are made
    assert getattr(made, "path", None) == "/new/deeper/f", made
    assert lookups == 4          # the check stops at /new; the commit walks, makes them
    assert (await store.stat("/new/deeper")).kind == "directory"
    assert (await store.stat("/d/f")).file_id == "f2".ljust(32, "0")


async def test_a_put_bumps_the_manifests_above_it_only_where_there_are_some(
        store: SQLiteStore) -> None:
    await store.mkdir("/m/sub", parents=True, exist_ok=False, now=1.0)
    seen: list[str] = []
    await put(store, "f1", "/m/sub/f", seen=seen)
    assert not [q for q in seen if "UPDATE manifests" in q]     # none to bump: no walk up
    await store.put_manifest("/m", b"{}", now=1.0)
    before = (await store.manifest_version("/m")).gen
    await put(store, "f2", "/m/sub/g", seen=seen)
    assert (await store.manifest_version("/m")).gen == before + 1
