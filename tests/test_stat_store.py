"""A stat on SQLite finds a path that is there in one statement on the reader (a join
down from the root: no BEGIN, no COMMIT, no look-up per component; issue 30), with
the answer the walk gives; a path that is not all there is walked, and the errors
say what is missing as before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stager.errors import NotADirectory, NotFound
from stager.meta.store.sqlite.lookup import MAX_JOINED
from stager.meta.store.sqlite.store import SQLiteStore
from stager.testing.metastore import commit_one, upload


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "meta.db")
    yield s
    s.close()


async def put(store: SQLiteStore, file_id: str, path: str) -> None:
    await store.begin_uploads([upload(file_id, path)])
    await commit_one(store, upload(file_id, path).file_id, size=3, checksums=(7,))


def walked(store: SQLiteStore, path: str):  # type: ignore[no-untyped-def]
    """The entry (or error) of the walk a component at a time, in a read transaction."""
    with store.database.snapshot():
        try:
            return store.reads.stat(path)
        except (NotFound, NotADirectory) as exc:
            return type(exc), str(exc)


async def stat_traced(store: SQLiteStore, path: str) -> tuple[object, list[str]]:
    seen: list[str] = []
    store.database.reader.set_trace_callback(seen.append)
    try:
        try:
            got: object = await store.stat(path)
        except (NotFound, NotADirectory) as exc:
            got = type(exc), str(exc)
    finally:
        store.database.reader.set_trace_callback(None)
    return got, seen


async def test_a_path_that_is_there_is_one_statement(store: SQLiteStore) -> None:
    await store.mkdir("/a/b/c", parents=True, exist_ok=False, now=1.0)
    await put(store, "f1", "/top")
    await put(store, "f2", "/a/b/c/deep")
    for path in ("/a", "/a/b", "/a/b/c", "/top", "/a/b/c/deep", "/a/b/c/"):
        got, seen = await stat_traced(store, path)
        assert got == walked(store, path), path
        assert len(seen) == 1 and "BEGIN" not in seen[0], (path, seen)
    assert (await store.stat("/a/b/c/deep")).checksums == (7,)


async def test_what_is_missing_is_said_as_before(store: SQLiteStore) -> None:
    await store.mkdir("/a/b", parents=True, exist_ok=False, now=1.0)
    await put(store, "f1", "/a/file")
    for path in ("/nope", "/a/nope", "/a/b/nope/deeper", "/a/file/below", "/a/file/x/y"):
        got, seen = await stat_traced(store, path)
        assert got == walked(store, path), path
        assert isinstance(got, tuple) and got[0] in (NotFound, NotADirectory), got
        assert "BEGIN" in seen, seen            # walked, in a read transaction
    assert (await store.stat("/")).kind == "directory"


async def test_a_path_deeper_than_one_join_is_walked(store: SQLiteStore) -> None:
    deep = "".join(f"/d{i}" for i in range(MAX_JOINED + 3))
    await store.mkdir(deep, parents=True, exist_ok=False, now=1.0)
    got, seen = await stat_traced(store, deep)
    assert got == walked(store, deep)
    assert "BEGIN" in seen
    got, seen = await stat_traced(store, deep[:deep.index(f"/d{MAX_JOINED}")])
    assert len(seen) == 1 and got == walked(store, "".join(f"/d{i}" for i in range(MAX_JOINED)))
