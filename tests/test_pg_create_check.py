"""A create's check on PostgreSQL walks its path for ids, kinds and layouts only: the
checksums of a file it would replace (4 bytes a chunk: megabytes for a large file)
are not fetched to be thrown away."""

from __future__ import annotations

from test_pg_joined_put import watched

from stager.errors import AlreadyExists
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.protocol.models import LayoutSpec
from stager.testing.metastore import commit_one, upload


async def test_checking_an_overwrite_fetches_no_checksums(pg_url: str) -> None:
    store = PostgreSQLStore(pg_url, pool_size=1)
    try:
        await store.mkdir("/a", parents=False, exist_ok=False, now=1.0)
        await store.set_layout("/a", LayoutSpec(chunk_size=1 << 16))
        chunks = 50_000
        u = upload("big", "/a/big")
        await store.begin_uploads([u])
        await commit_one(store, u.file_id, size=chunks * u.layout.chunk_size,
                         checksums=tuple(range(chunks)), mtime=2.0, now=2.0)
        seen = await watched(store)
        checks = [("/a/big", True, True), ("/a/big", False, True), ("/a/new", True, True)]
        got = [await store.check_creates([c]) for c in checks]
        got.append(await store.check_creates(checks))         # a batch: another walk
        spec = LayoutSpec(chunk_size=1 << 16)
        for one, batch in ((got[0], got[3][0]), (got[1], got[3][1]), (got[2], got[3][2])):
            assert one == [batch] or (isinstance(one[0], AlreadyExists)
                                      and isinstance(batch, AlreadyExists))
        assert got[0] == [spec] and got[2] == [spec] and isinstance(got[1][0], AlreadyExists)
        walks = [q for q in seen if q.startswith("WITH RECURSIVE walk")]
        assert len(walks) == 4 and not any("checksums" in q for q in walks), walks
    finally:
        store.close()
