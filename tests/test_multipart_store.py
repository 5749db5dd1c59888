"""S3 multipart uploads below the gateway: the store's records (both stores), and the
client over a real cluster (metadata + data servers in threads, both stores): aligned
parts are the file's chunks (completing copies nothing), unaligned ones are composed,
a part sent again replaces the first, an incomplete upload is invisible, and abort and
idle expiry free every chunk."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from stager.errors import NotFound
from stager.meta.store.base import MetaStore, NodeEntry
from stager.meta.store.multipart import MultipartRecord, PartRecord
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.meta.store.sqlite.store import SQLiteStore
from stager.testing.metastore import LAYOUT, commit_one, upload


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MetaStore]:
    opened: Callable[[], MetaStore]
    if request.param == "sqlite":
        opened = SQLiteStore(tmp_path / "meta.sqlite3")
    else:
        opened = PostgreSQLStore(request.getfixturevalue("pg_url"))
    yield opened
    opened.close()


def record(upload_id: str, path: str, file_id: str, touched: float = 10.0) -> MultipartRecord:
    return MultipartRecord(upload_id, path, file_id, LAYOUT, None, 1.0, touched)


def part(number: int, file_id: str, first: int = 0, size: int = 4, when: float = 20.0
         ) -> PartRecord:
    return PartRecord(number, file_id, first, size, f"{number:032x}", (number,), when)


async def begun(store: MetaStore, upload_id: str, path: str, file_id: str) -> MultipartRecord:
    u = upload(file_id, path)
    await store.begin_uploads([u])
    r = record(upload_id, path, u.file_id)
    await store.begin_multipart(r)
    return r


async def test_a_record_outlives_the_upload_lease_and_keeps_its_parts(store: MetaStore
                                                                       ) -> None:
    r = await begun(store, "u1", "/b/k", "m1")
    # the pending upload is not collected after upload_grace: its record is alive
    assert [u.file_id for u in await store.expired_uploads(1e9)] == []
    assert [u.file_id for u in await store.expired_uploads(math.inf)] == [r.file_id]
    assert await store.get_multipart("u1") == r
    assert await store.fix_part_size("u1", 8) == 8
    assert await store.fix_part_size("u1", 12) == 8          # the first one stays
    assert await store.fix_part_size("gone", 8) is None
    hidden = "h1".ljust(32, "0")
    assert await store.put_part("u1", part(2, hidden))
    assert await store.put_part("u1", part(1, r.file_id, when=30.0))
    assert [p.number for p in await store.list_parts("u1")] == [1, 2]
    assert (await store.get_multipart("u1")).touched == 30.0
    # part 2 sent again, now in place: the hidden one goes to garbage
    assert await store.put_part("u1", part(2, r.file_id, first=2, when=31.0))
    assert [g.file_id for g in await store.take_garbage(10)] == [hidden]
    assert (await store.list_parts("u1"))[1].first_chunk == 2
    assert await store.idle_multipart(30.5) == []
    assert [x.upload_id for x in await store.idle_multipart(31.5)] == ["u1"]


async def test_drop_frees_the_pending_file_and_hidden_parts_but_keeps_what_it_is_told(
        store: MetaStore) -> None:
    a = await begun(store, "ua", "/b/a", "ma")
    b = await begun(store, "ub", "/b/b", "mb")
    ha, hb = "ha".ljust(32, "0"), "hb".ljust(32, "0")
    await store.put_part("ua", part(1, ha))
    await store.put_part("ub", part(1, hb))
    listed = await store.list_multipart("/b/", after=("", ""), limit=10)
    assert [x.upload_id for x in listed] == ["ua", "ub"]
    assert [x.upload_id for x in await store.list_multipart("/b/", after=("/b/a", "ua"),
                                                            limit=10)] == ["ub"]
    # an abort: the pending file and the hidden part go to garbage, nothing visible
    await store.drop_multipart("ua", keep=(), now=5.0)
    assert sorted(g.file_id for g in await store.take_garbage(10)) == sorted([a.file_id, ha])
    with pytest.raises(NotFound):
        await store.get_multipart("ua")
    with pytest.raises(NotFound):
        await store.stat("/b/a")
    assert await store.list_parts("ua") == []
    assert not await store.put_part("ua", part(1, ha))     # gone: refused
    # a completion: the file committed, then the record dropped keeping it
    assert isinstance(await commit_one(store, b.file_id, size=4, checksums=(1,)), NodeEntry)
    await store.drop_multipart("ub", keep=(b.file_id, hb), now=6.0)
    assert sorted(g.file_id for g in await store.take_garbage(10)) == sorted([a.file_id, ha])
    assert (await store.stat("/b/b")).file_id == b.file_id
    with pytest.raises(NotFound):
        await store.drop_multipart("ub", keep=(), now=7.0)
