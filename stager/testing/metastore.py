"""Conformance tests for :class:`~stager.meta.store.base.MetaStore` implementations.

Every store runs the same suite, as every fsspec backend runs fsspec's::

    class TestMyStore(MetaStoreTests):
        @pytest.fixture
        def open_store(self, tmp_path):      # opens the store again on the same data
            return lambda: MyStore(tmp_path / "db")

The tests check what the interface promises: a file is visible only after its
commit, a rename is atomic, every write is a batch (of one or many) in one
transaction whose items fail alone, a layout is swapped by compare-and-swap, and
what was answered survives a reopen.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import pytest

from ..errors import (
    AlreadyExists,
    IsADirectory,
    NotADirectory,
    NotFound,
    UploadNotFound,
)
from ..meta.store.base import (
    EntryRecord,
    Garbage,
    ManifestRecord,
    MetaStore,
    NodeEntry,
    Upload,
    all_files,
)
from ..protocol.authmsg import TokenInfo
from ..protocol.models import Layout, LayoutSpec, TargetInfo

LAYOUT = Layout(chunk_size=1 << 20, stripe_count=2, replicas=1, targets=("t0", "t1"),
                nodes=("n0", "n1"))
OTHER = Layout(chunk_size=1 << 20, stripe_count=2, replicas=1, targets=("t0", "t2"),
               nodes=("n0", "n2"))


def upload(file_id: str, path: str, *, overwrite: bool = True) -> Upload:
    return Upload(file_id.ljust(32, "0"), path, LAYOUT, overwrite, True, 1.0)


async def commit_one(store: MetaStore, file_id: str, *, size: int = 0,
                     checksums: tuple[int, ...] = (), mtime: float = 1.0,
                     now: float = 1.0) -> NodeEntry | Exception:
    """A batch of one commit: its one result, the entry or the error in its place."""
    [result] = await store.commit_uploads([(file_id, size, checksums, mtime)], now=now)
    return result


class MetaStoreTests:
    """Subclass with an ``open_store`` fixture: a callable that opens the store."""

    @pytest.fixture
    async def store(self, open_store: Callable[[], MetaStore]) -> AsyncIterator[MetaStore]:
        store = open_store()
        yield store
        store.close()

    async def put(self, store: MetaStore, file_id: str, path: str, size: int = 0) -> str:
        u = upload(file_id, path)
        await store.begin_uploads([u])
        entry = await commit_one(store, u.file_id, size=size,
                                 checksums=(7,) if size else (), mtime=2.0, now=2.0)
        assert isinstance(entry, NodeEntry), entry
        return u.file_id

    async def test_a_file_is_visible_only_after_its_commit(self, store: MetaStore) -> None:
        u = upload("a1", "/d/f")
        await store.begin_uploads([u])
        with pytest.raises(NotFound):
            await store.stat("/d/f")
        assert await store.get_uploads([u.file_id]) == [u]
        entry = await commit_one(store, u.file_id, size=5, checksums=(9,), mtime=3.0, now=3.0)
        assert isinstance(entry, NodeEntry)
        assert (entry.path, entry.size, entry.layout) == ("/d/f", 5, LAYOUT)
        assert (await store.stat("/d/f")).checksums == (9,)
        [gone] = await store.get_uploads([u.file_id])
        assert isinstance(gone, UploadNotFound) and gone.details["file_id"] == u.file_id
        again = await commit_one(store, u.file_id, size=5, checksums=(9,))
        assert isinstance(again, UploadNotFound)          # in its place, not raised
        [aborted] = await store.abort_uploads([u.file_id], now=4.0)
        assert isinstance(aborted, UploadNotFound)
        assert (await store.stat("/d/f")).file_id == u.file_id        # changed nothing

    async def test_a_replaced_file_goes_to_garbage(self, store: MetaStore) -> None:
        first = await self.put(store, "b1", "/f")
        second = await self.put(store, "b2", "/f")
        assert [g.file_id for g in await store.take_garbage(10)] == [first]
        assert await store.retired(first) and not await store.retired(second)
        await store.drop_garbage([first], now=10.0, forget_before=0.0)
        assert await store.take_garbage(10) == []
        assert await store.retired(first)               # purged, still known retired
        await store.drop_garbage([], now=20.0, forget_before=11.0)
        assert not await store.retired(first)           # forgotten
        refused = upload("b3", "/f", overwrite=False)
        await store.begin_uploads([refused])
        assert isinstance(await commit_one(store, refused.file_id), AlreadyExists)
        assert await store.get_uploads([refused.file_id]) == [refused]   # still pending
        assert (await store.stat("/f")).file_id == second
        assert await store.abort_uploads([refused.file_id], now=30.0) == [None]
        assert [g.file_id for g in await store.take_garbage(10)] == [refused.file_id]
        assert await store.retired(refused.file_id)       # an abandoned upload is retired

    async def test_rename_is_atomic_and_remove_collects(self, store: MetaStore) -> None:
        await store.mkdir("/a/b", parents=True, exist_ok=False, now=1.0)
        file_id = await self.put(store, "c1", "/a/b/f")
        await store.rename("/a", "/z", overwrite=False, now=2.0)
        with pytest.raises(NotFound):
            await store.stat("/a/b/f")
        assert (await store.stat("/z/b/f")).file_id == file_id
        assert await store.path_of_file(file_id) == "/z/b/f"
        with pytest.raises(IsADirectory):
            await store.rename("/z/b/f", "/z/b", overwrite=True, now=3.0)
        assert await store.remove("/z", recursive=True, now=4.0) == 1
        assert [g.file_id for g in await store.take_garbage(10)] == [file_id]
        assert await store.counts() == (0, 1, 0)                # the root remains

    async def test_a_batch_commits_together_and_items_fail_alone(self, store: MetaStore
                                                                 ) -> None:
        await self.put(store, "d0", "/taken")
        batch = [upload("d1", "/n/one"), upload("d2", "/taken", overwrite=False),
                 upload("d3", "/n/two")]
        await store.begin_uploads(batch)
        checks = await store.check_creates([("/n/x", True, True), ("/taken", False, True)])
        assert isinstance(checks[1], AlreadyExists) and not isinstance(checks[0], Exception)
        results = await store.commit_uploads(
            [(u.file_id, 0, (), 1.0) for u in batch] + [("f" * 32, 0, (), 1.0)], now=1.0)
        assert [type(r).__name__ for r in results] == [
            "NodeEntry", "AlreadyExists", "NodeEntry", "UploadNotFound"]
        assert [e.path for e in await store.list_dir("/n", after="", limit=10)] == [
            "/n/one", "/n/two"]
        aborted = await store.abort_uploads([batch[1].file_id, "e" * 32], now=2.0)
        assert aborted[0] is None and isinstance(aborted[1], UploadNotFound)

    async def test_replace_layout_is_compare_and_swap(self, store: MetaStore) -> None:
        file_id = await self.put(store, "e1", "/f", size=10)
        assert await store.replace_layout(file_id, LAYOUT, OTHER)
        assert not await store.replace_layout(file_id, LAYOUT, OTHER)     # not old any more
        stored = await store.file_by_id(file_id)
        assert stored is not None and stored.layout == OTHER and stored.checksums == (7,)
        on_t2 = [f.file_id async for f in all_files(store, targets=frozenset({"t2"}))]
        assert on_t2 == [file_id]
        await store.remove("/f", recursive=False, now=2.0)
        assert not await store.replace_layout(file_id, OTHER, LAYOUT)    # never resurrected
        assert await store.file_by_id(file_id) is None

    async def test_replace_upload_layout_is_compare_and_swap(self, store: MetaStore) -> None:
        pending = upload("u1", "/u")
        await store.begin_uploads([pending])
        assert await store.replace_upload_layout(pending.file_id, pending.layout, OTHER)
        assert not await store.replace_upload_layout(pending.file_id, pending.layout, OTHER)
        assert await store.get_uploads([pending.file_id]) == [replace(pending, layout=OTHER)]
        entry = await commit_one(store, pending.file_id)
        assert isinstance(entry, NodeEntry) and entry.layout == OTHER   # as last written
        assert not await store.replace_upload_layout(pending.file_id, OTHER, LAYOUT)

    async def test_overlapping_calls_and_reopen_keep_what_was_answered(
            self, open_store: Callable[[], MetaStore]) -> None:
        store = open_store()
        try:
            await store.upsert_target(TargetInfo("t0", "n0", "http://127.0.0.1:1"))
            uploads = [upload(f"f{i:02d}", f"/many/f{i}") for i in range(20)]
            await asyncio.gather(*(store.begin_uploads([u]) for u in uploads))
            done = await asyncio.gather(*(commit_one(store, u.file_id) for u in uploads))
            assert all(isinstance(e, NodeEntry) for e in done)
        finally:
            store.close()
        again = open_store()
        try:
            assert len(await again.list_dir("/many", after="", limit=100)) == 20
            assert [t.id for t in await again.list_targets()] == ["t0"]
        finally:
            again.close()

    async def test_a_manifest_version_moves_with_each_visible_change(
            self, store: MetaStore) -> None:
        await store.mkdir("/ds/sub", parents=True, exist_ok=False, now=1.0)
        await store.mkdir("/other", parents=False, exist_ok=False, now=1.0)
        await store.put_manifest("/ds", b"m", now=1.5)
        await store.put_manifest("/ds/sub", b"m", now=1.5)
        with pytest.raises(NotFound):
            await store.manifest_version("/other")
        v = await store.manifest_version("/ds")
        assert v.created == 1.5 and v.dir_id == (await store.manifest_version("/ds")).dir_id
        last = {p: (await store.manifest_version(p)).gen for p in ("/ds", "/ds/sub")}

        async def bumped() -> dict[str, int]:
            """How far each manifest's gen moved since the last call."""
            now = {p: (await store.manifest_version(p)).gen for p in last}
            moved = {p: now[p] - last[p] for p in last}
            last.update(now)
            return moved

        pending = upload("v1", "/ds/sub/f")
        await store.begin_uploads([pending])         # not visible: nothing moves
        assert await bumped() == {"/ds": 0, "/ds/sub": 0}
        await commit_one(store, pending.file_id, mtime=2.0, now=2.0)
        assert await bumped() == {"/ds": 1, "/ds/sub": 1}
        await self.put(store, "v2", "/other/x")      # outside the subtree
        await self.put(store, "v3", "/other/y")
        assert await bumped() == {"/ds": 0, "/ds/sub": 0}
        batch = [upload("v4", "/ds/a"), upload("v5", "/ds/sub/b"), upload("v6", "/ds/sub/c")]
        await store.begin_uploads(batch)
        await store.commit_uploads([(u.file_id, 0, (), 2.0) for u in batch], now=2.0)
        assert await bumped() == {"/ds": 1, "/ds/sub": 1}     # one bump for the batch
        grouped = [upload(f"v7{i}", f"/ds/sub/g{i}") for i in range(3)]
        await store.begin_uploads(grouped)
        await asyncio.gather(*(commit_one(store, u.file_id, mtime=2.0, now=2.0)
                               for u in grouped))
        assert all(n >= 1 for n in (await bumped()).values())
        await store.rename("/ds/sub/f", "/other/f", overwrite=False, now=3.0)
        assert await bumped() == {"/ds": 1, "/ds/sub": 1}
        await store.rename("/other/y", "/ds/y", overwrite=False, now=3.0)
        assert await bumped() == {"/ds": 1, "/ds/sub": 0}
        await store.rename("/other/x", "/other/x2", overwrite=False, now=3.0)
        assert await bumped() == {"/ds": 0, "/ds/sub": 0}
        assert not await store.replace_layout(batch[1].file_id, OTHER, LAYOUT)   # lost CAS
        assert await bumped() == {"/ds": 0, "/ds/sub": 0}
        assert await store.replace_layout(batch[1].file_id, LAYOUT, OTHER)
        assert await bumped() == {"/ds": 1, "/ds/sub": 1}
        await store.remove("/ds/y", recursive=False, now=4.0)
        assert await bumped() == {"/ds": 1, "/ds/sub": 0}
        await store.remove("/other", recursive=True, now=4.0)
        assert await bumped() == {"/ds": 0, "/ds/sub": 0}
        await store.put_manifest("/ds/sub", b"m2", now=5.0)
        assert await bumped() == {"/ds": 0, "/ds/sub": 1}
        assert (await store.manifest_version("/ds/sub")).created == 5.0
        await store.mkdir("/ds/sub/deeper/gone", parents=True, exist_ok=False, now=5.0)
        await self.put(store, "v8", "/ds/sub/deeper/gone/f")
        assert await bumped() == {"/ds": 1, "/ds/sub": 1}
        await store.remove("/ds/sub/deeper", recursive=True, now=6.0)
        assert await bumped() == {"/ds": 1, "/ds/sub": 1}
        del last["/ds/sub"]
        await store.remove("/ds/sub", recursive=True, now=6.0)    # its manifest goes too
        assert await bumped() == {"/ds": 1}
        with pytest.raises(NotFound):
            await store.manifest_version("/ds/sub")
        with pytest.raises(NotADirectory):
            await store.manifest_version("/ds/a")

    async def test_tokens_are_recorded_listed_and_revoked_for_good(
            self, open_store: Callable[[], MetaStore]) -> None:
        first = TokenInfo("a" * 32, "team-a", ("read",), ("/data/a",), 10, 100)
        second = TokenInfo("b" * 32, "ops", ("admin",), ("/",), 20, 200)
        store = open_store()
        try:
            await store.put_token(second)
            await store.put_token(first)
            assert await store.list_tokens() == [first, second]      # oldest first
            revoked = await store.revoke_token(first.id, now=50)
            assert revoked.revoked == 50 and revoked.name == "team-a"
            assert (await store.revoke_token(first.id, now=60)).revoked == 50   # kept
            with pytest.raises(NotFound):
                await store.revoke_token("c" * 32, now=60)
        finally:
            store.close()
        again = open_store()
        try:
            assert [t.revoked for t in await again.list_tokens()] == [50, None]
        finally:
            again.close()

    async def test_a_join_tokens_uses_are_spent_one_at_a_time(
            self, store: MetaStore) -> None:
        limited = TokenInfo("a" * 32, "nodes", ("join",), ("/",), 10, 100, uses=2)
        unlimited = TokenInfo("b" * 32, "ops", ("join",), ("/",), 10, 100)
        await store.put_token(limited)
        await store.put_token(unlimited)
        spent = await asyncio.gather(*(store.take_token_use(limited.id) for _ in range(5)))
        assert sorted(spent) == [False, False, False, True, True]   # exactly two, at once
        assert [t.uses for t in await store.list_tokens()] == [0, None]
        assert await store.take_token_use(unlimited.id)
        assert not await store.take_token_use("c" * 32)              # no such token

    async def test_a_target_credential_is_pinned_by_compare_and_swap(
            self, store: MetaStore) -> None:
        t = TargetInfo("t0", "n0", "http://127.0.0.1:1", capacity=10)
        await store.upsert_target(t)
        assert await store.target_credential("t0") is None
        assert await store.pin_target_credential("t0", "a" * 32, replaces=None)
        assert not await store.pin_target_credential("t0", "b" * 32, replaces=None)
        assert not await store.pin_target_credential("t0", "b" * 32, replaces="c" * 32)
        assert await store.target_credential("t0") == "a" * 32
        assert await store.pin_target_credential("t0", "b" * 32, replaces="a" * 32)
        await store.upsert_target(replace(t, used=3))       # a heartbeat keeps the pin
        assert await store.target_credential("t0") == "b" * 32
        await store.forget_target("t0")
        assert await store.target_credential("t0") is None
        assert await store.list_targets() == []
        await store.forget_target("t0")                     # twice: nothing to do

    async def test_a_whole_store_dumps_and_loads_with_its_row_ids(
            self, store: MetaStore) -> None:
        """What ``stager meta migrate`` copies with: rows keep their ids (a child may
        have a lower id than its parent, after a rename), and new rows get fresh ones."""
        spec = LayoutSpec(chunk_size=1 << 16, replicas=2)
        rows = [EntryRecord(1, 0, "", "directory", 0, 5.0, default_layout=LayoutSpec(
                    stripe_count=1)),
                EntryRecord(7, 10, "f", "file", 5, 6.0, "a" * 32, LAYOUT, checksums=(1, 2)),
                EntryRecord(8, 10, "empty", "file", 0, 6.5, "b" * 32, OTHER),
                EntryRecord(10, 1, "d", "directory", 0, 7.0, default_layout=spec)]
        await store.load_entries(rows)
        await store.load_manifests([ManifestRecord(10, b"manifest", 3.0)])
        gone = Garbage("c" * 32, OTHER, 9, 4.0)
        await store.load_garbage([gone])
        await store.load_garbage([Garbage("c" * 32, LAYOUT, 1, 1.0)])   # kept as it was

        assert await store.dump_entries(after=0, limit=10) == sorted(rows, key=lambda r: r.row)
        assert await store.dump_entries(after=7, limit=1) == [rows[2]]
        assert await store.dump_manifests(after=0, limit=10) == [
            ManifestRecord(10, b"manifest", 3.0)]
        assert await store.dump_manifests(after=10, limit=10) == []
        assert await store.dump_garbage(after="", limit=10) == [gone]
        assert await store.dump_garbage(after=gone.file_id, limit=10) == []
        f = await store.stat("/d/f")
        assert (f.size, f.mtime, f.file_id, f.layout, f.checksums) == (
            5, 6.0, "a" * 32, LAYOUT, (1, 2))
        assert (await store.stat("/d")).default_layout == spec
        assert await store.get_manifest("/d") == (b"manifest", 3.0)
        assert await store.path_of_file("b" * 32) == "/d/empty"
        assert await store.counts() == (2, 2, 5)
        made = await store.mkdir("/d/new", parents=False, exist_ok=False, now=8.0)
        assert made.is_dir
        assert [(r.row > 10, r.name) for r in await store.dump_entries(after=10, limit=10)
                ] == [(True, "new")]
        # the loaded default layouts are inherited, nearest directory first
        assert (await store.check_creates([("/d/g", False, False)]))[0] == LayoutSpec(
            chunk_size=1 << 16, stripe_count=1, replicas=2)

    async def test_shared_state_is_kept_by_key_and_prefix(
            self, open_store: Callable[[], MetaStore]) -> None:
        store = open_store()
        try:
            await store.put_state("suspect/t1", {"until": 5.0})
            await store.put_state("suspect/t2", {"until": 6.0})
            await store.put_state("status/fsck", {"clean": True, "files": 3})
            await store.put_state("suspect/t1", {"until": 7.0})          # replaced
            await store.put_state("suspect/t2", None)                    # forgotten
            await store.put_state("nothing/here", None)                  # nothing to forget
            assert await store.get_states("suspect/") == {"suspect/t1": {"until": 7.0}}
            assert await store.hold_duties()                 # the only server: it holds them
        finally:
            store.close()
        again = open_store()
        try:
            assert await again.get_states("status/") == {"status/fsck": {"clean": True,
                                                                          "files": 3}}
            assert set(await again.get_states("")) == {"suspect/t1", "status/fsck"}
        finally:
            again.close()

    async def test_a_heartbeat_does_not_undo_a_removal(self, store: MetaStore) -> None:
        t = TargetInfo("t0", "n0", "http://127.0.0.1:1", capacity=10, state="up")
        await store.touch_target(t)                          # registers when unknown
        await store.touch_target(replace(t, used=4, last_heartbeat=9.0))
        [stored] = await store.list_targets()
        assert (stored.used, stored.last_heartbeat, stored.state) == (4, 9.0, "up")
        await store.upsert_target(replace(t, state="removed"))
        await store.touch_target(replace(t, used=5, last_heartbeat=10.0, state="up"))
        [stored] = await store.list_targets()
        assert (stored.used, stored.last_heartbeat, stored.state) == (5, 10.0, "removed")

    async def test_a_batch_of_heartbeats_is_each_of_them(self, store: MetaStore) -> None:
        """touch_targets as the single touches in turn: a target twice keeps the last, a
        removed one stays removed, an unknown one registers."""
        t0 = TargetInfo("t0", "n0", "http://127.0.0.1:1", capacity=10, state="up")
        t1 = TargetInfo("t1", "n0", "http://127.0.0.1:2", capacity=10, state="up")
        await store.upsert_target(replace(t1, state="removed"))
        await store.touch_targets([t0, replace(t0, used=6, last_heartbeat=3.0),
                                   replace(t1, used=2, last_heartbeat=3.0)])
        got = {t.id: (t.used, t.last_heartbeat, t.state)
               for t in await store.list_targets()}
        assert got == {"t0": (6, 3.0, "up"), "t1": (2, 3.0, "removed")}
        await store.put_reports([("job/0/", {"samples": 1}, 10.0),
                                 ("job/0/", {"samples": 2}, 10.0)])
        assert await store.live_reports(5.0) == {"job/0/": {"samples": 2}}

    async def test_loader_reports_live_until_they_expire(self, store: MetaStore) -> None:
        await store.put_report("job/0/", {"samples": 1}, expires=10.0)
        await store.put_report("job/1/", {"samples": 2}, expires=20.0)
        await store.put_report("job/0/", {"samples": 3}, expires=30.0)     # replaced
        assert await store.live_reports(5.0) == {"job/0/": {"samples": 3},
                                                 "job/1/": {"samples": 2}}
        assert await store.live_reports(25.0) == {"job/0/": {"samples": 3}}
        assert await store.live_reports(5.0) == {"job/0/": {"samples": 3}}  # dropped for good

    async def test_answers_are_recorded_once_kept_and_expire(
            self, open_store: Callable[[], MetaStore]) -> None:
        store = open_store()
        try:
            assert await store.recorded_answer("k1") is None
            assert await store.record_answer("k1", 200, b'{"a": 1}', now=10.0)
            assert not await store.record_answer("k1", 201, b'{"a": 2}', now=11.0)  # first kept
            assert await store.record_answer("k2", 200, b"{}", now=20.0)
            assert await store.recorded_answer("k1") == (200, b'{"a": 1}')
        finally:
            store.close()
        again = open_store()
        try:
            assert await again.recorded_answer("k1") == (200, b'{"a": 1}')   # survives a reopen
            assert await again.expire_answers(15.0) == 1
            assert await again.recorded_answer("k1") is None
            assert await again.recorded_answer("k2") == (200, b"{}")
        finally:
            again.close()
