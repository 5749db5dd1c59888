"""Conformance tests of the :class:`~stager.meta.store.base.Caching` role, run with
:class:`.MetaStoreTests`::

    class TestMyStore(MetaStoreTests, CacheStoreTests): ...

Attachments and their files are kept by path and file id; a chunk's fill is leased to
one holder at a time (five concurrent takes: one wins; on a shared store, takes
through two connections pools as two servers make them), until filled, released or
expired; a fill recorded for a file no longer cached records nothing; and what is
filled is paged, evicted and summed per attachment.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import pytest

from ..errors import NotFound
from ..meta.store.base import MetaStore
from ..meta.store.caching import AttachmentRecord, CachedChunk, CachedFile

CRC = 0xFFFFFFFF                # the largest CRC32C: stored without a sign


def attachment(path: str, source: str = "s3://bucket/data", **kw: object) -> AttachmentRecord:
    fields: dict[str, object] = dict(options=b"\x00sealed", refresh=60.0, include=("*.bin",),
                                     exclude=("tmp/*", "*.part"), listed=5.0, created=1.0)
    return AttachmentRecord(path, source, **{**fields, **kw})  # type: ignore[arg-type]


def cached(file_id: str, attachment: str, name: str, version: str = "etag-1") -> CachedFile:
    return CachedFile(file_id, attachment, f"{attachment}/{name}", f"data/{name}", version)


class CacheStoreTests:
    """Mixed into a :class:`.MetaStoreTests` subclass (its ``store``, ``open_store``
    and ``put``)."""

    async def filled(self, store: MetaStore, file_id: str, chunks: dict[int, int], *,
                     now: float = 10.0) -> None:
        """Lease and fill chunks ``{index: size}`` of ``file_id``."""
        for index, size in chunks.items():
            assert await store.take_fill(file_id, index, "filler", until=now + 30, now=now)
            assert await store.record_fill(file_id, index, size=size, crc=CRC - index,
                                           now=now)

    async def test_attachments_are_put_listed_replaced_and_dropped(
            self, open_store: Callable[[], MetaStore]) -> None:
        store = open_store()
        try:
            b, a = attachment("/b", "file:///srv/b", refresh=None, include=(), exclude=()), \
                attachment("/a")
            await store.put_attachment(b)
            await store.put_attachment(a)
            assert await store.attachments() == [a, b]                      # by path
            await store.touch_chunks([], 1.0, {"/a": (3, 2)})
            again = attachment("/a", "gs://other/x", listed=9.0, include=())
            await store.put_attachment(again)                      # replaced, counts kept
            [stored, _] = await store.attachments()
            assert stored == replace(again, hits=3, misses=2)
            await store.put_cached_files([cached("f1".ljust(32, "0"), "/a", "x"),
                                          cached("f2".ljust(32, "0"), "/b", "y")])
            await self.filled(store, "f1".ljust(32, "0"), {0: 4})
        finally:
            store.close()
        store = open_store()                                       # kept across a reopen
        try:
            assert [r.source for r in await store.attachments()] == ["gs://other/x",
                                                                     "file:///srv/b"]
            dropped = await store.drop_attachment("/a")
            assert dropped == [cached("f1".ljust(32, "0"), "/a", "x")]
            assert await store.attachments() == [b]
            assert await store.cached_files("/a") == []
            assert await store.filled_chunks("f1".ljust(32, "0"), [0]) == {}   # rows gone
            assert await store.cache_chunks() == []
            assert len(await store.cached_files("/b")) == 1              # the other kept
            with pytest.raises(NotFound):
                await store.drop_attachment("/a")
            assert await store.drop_attachment("/b") != []
            assert await store.attachments() == []
        finally:
            store.close()

    async def test_cached_files_are_found_replaced_and_dropped(self, store: MetaStore) -> None:
        ids = [f"c{i}".ljust(32, "0") for i in range(3)]
        await store.put_attachment(attachment("/v"))
        await store.put_cached_files([cached(ids[1], "/v", "b"), cached(ids[0], "/v", "c"),
                                      cached(ids[2], "/v", "a")])
        assert [f.path for f in await store.cached_files("/v")] == ["/v/a", "/v/b", "/v/c"]
        assert await store.find_cached([ids[0], "nope".ljust(32, "0")]) == \
            {ids[0]: cached(ids[0], "/v", "c")}
        assert await store.find_cached([]) == {}
        await store.put_cached_files([cached(ids[0], "/v", "c", version="etag-2")])
        assert (await store.find_cached([ids[0]]))[ids[0]].version == "etag-2"
        await self.filled(store, ids[0], {0: 10, 1: 5})
        await self.filled(store, ids[1], {0: 7})
        await store.drop_cached_files([ids[0], ids[2]])
        assert [f.file_id for f in await store.cached_files("/v")] == [ids[1]]
        assert await store.filled_chunks(ids[0], [0, 1]) == {}           # its chunk rows too
        assert [(c.file_id, c.index) for c in await store.cache_chunks()] == [(ids[1], 0)]

    async def test_a_fill_is_leased_to_one_holder_until_filled_released_or_expired(
            self, store: MetaStore) -> None:
        f = "l1".ljust(32, "0")
        await store.put_attachment(attachment("/l"))
        await store.put_cached_files([cached(f, "/l", "x")])
        assert await store.take_fill(f, 0, "s1", until=20.0, now=10.0)
        assert not await store.take_fill(f, 0, "s2", until=30.0, now=19.9)   # leased
        assert await store.take_fill(f, 0, "s1", until=25.0, now=19.9)       # its own again
        assert not await store.take_fill(f, 0, "s2", until=30.0, now=24.9)
        assert await store.take_fill(f, 0, "s2", until=40.0, now=25.0)       # expired: taken
        assert not await store.take_fill(f, 0, "s1", until=50.0, now=30.0)
        assert await store.filled_chunks(f, [0]) == {}                  # a lease is not filled
        assert await store.cache_chunks() == []
        await store.release_fill(f, 0, "s1")                    # not s1's: nothing changes
        assert not await store.take_fill(f, 0, "s3", until=50.0, now=30.0)
        await store.release_fill(f, 0, "s2")                    # s2's fill failed
        assert await store.take_fill(f, 0, "s3", until=50.0, now=30.0)
        assert await store.record_fill(f, 0, size=1 << 20, crc=CRC, now=31.0)
        assert await store.filled_chunks(f, [0, 1]) == {0: CRC}
        for holder, now in (("s3", 31.0), ("s4", 1e9)):          # filled: never leased again
            assert not await store.take_fill(f, 0, holder, until=now + 10, now=now)
        await store.release_fill(f, 0, "s3")                     # a filled chunk stays
        [chunk] = await store.cache_chunks()
        assert chunk == CachedChunk(f, 0, 1 << 20, CRC, 31.0, 31.0, "/l/x", "/l")

    async def test_concurrent_takes_of_a_chunk_lease_it_once(
            self, store: MetaStore, open_store: Callable[[], MetaStore]) -> None:
        # a shared store's takes come from two servers: two pools of connections
        other = open_store() if store.shared else store
        try:
            f = "t1".ljust(32, "0")
            await store.put_attachment(attachment("/t"))
            await store.put_cached_files([cached(f, "/t", "x")])
            stores = [store, other]
            for index in range(4):
                taken = await asyncio.gather(*(
                    stores[h % 2].take_fill(f, index, f"h{h}", until=20.0, now=10.0)
                    for h in range(5)))
                assert sum(taken) == 1, (index, taken)
            # expired leases, taken again by five at once: one wins again
            taken = await asyncio.gather(*(
                stores[h % 2].take_fill(f, 0, f"late{h}", until=40.0, now=30.0)
                for h in range(5)))
            assert sum(taken) == 1, taken
        finally:
            if other is not store:
                other.close()

    async def test_a_fill_of_a_file_no_longer_cached_records_nothing(
            self, store: MetaStore) -> None:
        f = "r1".ljust(32, "0")
        await store.put_attachment(attachment("/r"))
        await store.put_cached_files([cached(f, "/r", "x")])
        assert await store.take_fill(f, 0, "s1", until=20.0, now=10.0)
        assert await store.take_fill(f, 1, "s1", until=20.0, now=10.0)
        await store.drop_cached_files([f])                      # refreshed meanwhile
        assert not await store.record_fill(f, 0, size=10, crc=1, now=11.0)
        await store.put_cached_files([cached(f, "/r", "x")])    # even if it comes back
        assert await store.filled_chunks(f, [0, 1]) == {}
        assert await store.cache_chunks() == []
        assert await store.take_fill(f, 0, "s2", until=20.0, now=12.0)   # no lease left
        await store.drop_attachment("/r")                       # detached meanwhile
        assert not await store.record_fill(f, 0, size=10, crc=1, now=13.0)
        assert await store.filled_chunks(f, [0]) == {}
        assert await store.cache_usage() == {}

    async def test_touches_mark_use_and_count_hits_and_misses(self, store: MetaStore) -> None:
        f, g = "u1".ljust(32, "0"), "u2".ljust(32, "0")
        await store.put_attachment(attachment("/u"))
        await store.put_attachment(attachment("/w"))
        await store.put_cached_files([cached(f, "/u", "x"), cached(g, "/u", "y")])
        await self.filled(store, f, {0: 1, 1: 1}, now=10.0)
        await self.filled(store, g, {0: 1}, now=10.0)
        assert await store.take_fill(g, 1, "s1", until=90.0, now=10.0)      # a lease
        await store.touch_chunks([(f, 1), (g, 0), (g, 1), (g, 7)], 50.0,
                                 {"/u": (2, 1), "/nowhere": (5, 5)})
        await store.touch_chunks([(f, 1)], 40.0, {"/u": (1, 0), "/w": (0, 3)})
        used = {(c.file_id, c.index): (c.filled, c.used) for c in await store.cache_chunks()}
        assert used == {(f, 0): (10.0, 10.0), (f, 1): (10.0, 50.0),   # never back in time
                        (g, 0): (10.0, 50.0)}                         # the lease not filled
        counts = {a.path: (a.hits, a.misses) for a in await store.attachments()}
        assert counts == {"/u": (3, 1), "/w": (0, 3)}

    async def test_filled_chunks_are_paged_evicted_and_summed_per_attachment(
            self, store: MetaStore) -> None:
        ids = {name: await self.put(store, name, f"/{path}", size)
               for name, path, size in (("p1", "m/a", 300), ("p2", "m/b", 50),
                                        ("p3", "n/c", 7))}
        await store.put_attachment(attachment("/m"))
        await store.put_attachment(attachment("/n"))
        await store.put_attachment(attachment("/empty"))
        await store.put_cached_files([cached(ids["p1"], "/m", "a"), cached(ids["p2"], "/m", "b"),
                                      cached(ids["p3"], "/n", "c")])
        await self.filled(store, ids["p1"], {0: 100, 1: 100, 2: 100})
        await self.filled(store, ids["p2"], {0: 50})
        await self.filled(store, ids["p3"], {11: 7})
        assert await store.take_fill(ids["p2"], 1, "s", until=99.0, now=10.0)  # not listed
        assert await store.cache_usage() == {"/m": (2, 350, 4, 350), "/n": (1, 7, 1, 7),
                                             "/empty": (0, 0, 0, 0)}
        everything = await store.cache_chunks()
        expected = sorted([(ids["p1"], i) for i in range(3)] + [(ids["p2"], 0), (ids["p3"], 11)])
        assert [(c.file_id, c.index) for c in everything] == expected
        assert {c.file_id: (c.path, c.attachment) for c in everything} == {
            ids["p1"]: ("/m/a", "/m"), ids["p2"]: ("/m/b", "/m"), ids["p3"]: ("/n/c", "/n")}
        pages, after = [], ("", -1)
        while page := await store.cache_chunks(after=after, limit=2):
            pages.append(page)
            after = (page[-1].file_id, page[-1].index)
        assert [len(p) for p in pages] == [2, 2, 1]
        assert [c for p in pages for c in p] == everything
        await store.evict_chunks([(ids["p1"], 0), (ids["p1"], 2), (ids["p3"], 11),
                                  (ids["p2"], 1)])                  # a lease is not evicted
        assert await store.filled_chunks(ids["p1"], [0, 1, 2]) == {1: CRC - 1}
        assert await store.cache_usage() == {"/m": (2, 350, 2, 150), "/n": (1, 7, 0, 0),
                                             "/empty": (0, 0, 0, 0)}
        assert not await store.take_fill(ids["p2"], 1, "other", until=99.0, now=10.0)
        assert await store.take_fill(ids["p1"], 0, "other", until=99.0, now=10.0)  # again
