"""Conformance tests of the :class:`~stager.meta.store.base.Quotas` and
:class:`~stager.meta.store.base.Pins` roles, run with :class:`.MetaStoreTests`::

    class TestMyStore(MetaStoreTests, QuotaStoreTests): ...

A quota's use is kept exact by every write, remove and rename, across a reopen and
under concurrent commits; a pin covers its subtree until unpinned or expired.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from ..errors import NotADirectory, NotFound, QuotaExceeded, UploadNotFound
from ..meta.store.base import MetaStore, NodeEntry
from .metastore import commit_one, upload


class QuotaStoreTests:
    """Mixed into a :class:`.MetaStoreTests` subclass (its ``store``, ``open_store``
    and ``put``)."""

    async def quota(self, store: MetaStore, path: str) -> tuple[int, int]:
        """(used bytes, used files) of the quota on ``path``."""
        [q] = [q for q in await store.list_quotas() if q.path == path]
        return q.used_bytes, q.used_files

    async def test_a_quota_keeps_its_use_and_refuses_a_write_past_it(
            self, open_store: Callable[[], MetaStore]) -> None:
        store = open_store()
        try:
            await self.put(store, "q1", "/q/a", size=100)
            await self.put(store, "o1", "/elsewhere/x", size=999)
            quota = await store.set_quota("/q", max_bytes=250, max_files=None)
            assert (quota.path, quota.bytes, quota.used_bytes, quota.used_files) == \
                ("/q", 250, 100, 1)                        # counted from the subtree
            await self.put(store, "q2", "/q/sub/b", size=100)       # a new parent too
            assert await self.quota(store, "/q") == (200, 2)
            u = upload("q3", "/q/sub/c")
            await store.begin_uploads([u])
            refused = await commit_one(store, u.file_id, size=51)
            assert isinstance(refused, QuotaExceeded), refused
            assert refused.details == {"path": "/q/sub/c", "directory": "/q",
                                       "resource": "bytes", "limit": 250, "use": 200}
            with pytest.raises(NotFound):
                await store.stat("/q/sub/c")           # nothing of it is visible
            [gone] = await store.get_uploads([u.file_id])   # final: its chunks collected
            assert isinstance(gone, UploadNotFound) and await store.retired(u.file_id)
            assert await self.quota(store, "/q") == (200, 2)
            await self.put(store, "q4", "/q/a", size=150)   # an overwrite adds 50: at the limit
            assert await self.quota(store, "/q") == (250, 2)
            # a batch: the item past the quota fails in its place, the others commit
            items = [upload("q5", "/q/none"), upload("q6", "/q/more"), upload("q7", "/out/y")]
            await store.begin_uploads(items)
            results = await store.commit_uploads(
                [(items[0].file_id, 0, (), 1.0), (items[1].file_id, 1, (7,), 1.0),
                 (items[2].file_id, 1, (7,), 1.0)], now=2.0)
            assert isinstance(results[0], NodeEntry) and isinstance(results[2], NodeEntry)
            assert isinstance(results[1], QuotaExceeded), results
            assert await self.quota(store, "/q") == (250, 3)
            await store.remove("/q/a", recursive=False, now=3.0)            # frees 150
            assert await self.quota(store, "/q") == (100, 2)
            await store.rename("/q/sub", "/out/sub", overwrite=False, now=3.0)  # moves out
            assert await self.quota(store, "/q") == (0, 1)
            await store.rename("/out/sub", "/q/sub", overwrite=False, now=3.0)  # and back in
            assert await self.quota(store, "/q") == (100, 2)
            await self.put(store, "q8", "/q/sub/big", size=150)
            with pytest.raises(QuotaExceeded):          # moving in past the limit: refused
                await store.rename("/elsewhere/x", "/q/x", overwrite=False, now=3.0)
            assert (await store.stat("/elsewhere/x")).size == 999
            await store.remove("/q/sub", recursive=True, now=4.0)
            assert await self.quota(store, "/q") == (0, 1)
        finally:
            store.close()
        again = open_store()
        try:
            assert await self.quota(again, "/q") == (0, 1)       # kept across a reopen
            await again.set_quota("/q", max_bytes=None, max_files=None)
            assert await again.list_quotas() == []
        finally:
            again.close()

    async def test_a_file_quota_and_the_quotas_of_nested_directories(
            self, store: MetaStore) -> None:
        await store.mkdir("/n/inner", parents=True, exist_ok=False, now=1.0)
        await store.set_quota("/n", max_bytes=None, max_files=2)
        await store.set_quota("/n/inner", max_bytes=10, max_files=None)
        await self.put(store, "n1", "/n/inner/a", size=10)
        u = upload("n2", "/n/inner/b")
        await store.begin_uploads([u])
        refused = await commit_one(store, u.file_id, size=1)
        assert isinstance(refused, QuotaExceeded) and refused.details["directory"] == "/n/inner"
        await self.put(store, "n3", "/n/c")
        u = upload("n4", "/n/d")
        await store.begin_uploads([u])
        refused = await commit_one(store, u.file_id)
        assert isinstance(refused, QuotaExceeded)
        assert (refused.details["resource"], refused.details["limit"]) == ("files", 2)
        with pytest.raises(NotADirectory):
            await store.set_quota("/n/c", max_bytes=1, max_files=None)
        await store.remove("/n/inner", recursive=True, now=2.0)     # its quota goes with it
        assert [q.path for q in await store.list_quotas()] == ["/n"]
        assert await self.quota(store, "/n") == (0, 1)

    async def test_concurrent_commits_never_pass_a_quota(self, store: MetaStore) -> None:
        await store.mkdir("/c", parents=False, exist_ok=False, now=1.0)
        await store.set_quota("/c", max_bytes=5 * 10, max_files=None)
        uploads = [upload(f"c{i:02d}", f"/c/f{i}") for i in range(16)]
        await store.begin_uploads(uploads)
        results = await asyncio.gather(*(commit_one(store, u.file_id, size=10)
                                         for u in uploads))
        assert sum(isinstance(r, NodeEntry) for r in results) == 5
        assert all(isinstance(r, NodeEntry | QuotaExceeded) for r in results), results
        assert await self.quota(store, "/c") == (50, 5)
        assert len(await store.list_dir("/c", after="", limit=100)) == 5

    async def test_pins_are_listed_until_unpinned_or_expired(self, store: MetaStore) -> None:
        await self.put(store, "p1", "/p/d/f")
        await store.mkdir("/p/other", parents=False, exist_ok=False, now=1.0)
        await store.pin("/p/d", expires=100.0, now=10.0)
        assert await store.is_pinned("/p/d/f", 50.0)           # below a pinned directory
        assert not await store.is_pinned("/p/other", 50.0)
        assert not await store.is_pinned("/p/d/f", 100.0)      # the ttl ended
        assert await store.pins(100.0) == []
        pinned = await store.pin("/p/d/f", expires=None, now=20.0)
        assert await store.pins(1e12) == [pinned]
        assert await store.is_pinned("/p/d/f", 1e12)
        await store.unpin("/p/d/f")
        assert not await store.is_pinned("/p/d/f", 30.0)
        with pytest.raises(NotFound):
            await store.unpin("/p/d/f")
        with pytest.raises(NotFound):
            await store.pin("/p/nothing", expires=None, now=1.0)
