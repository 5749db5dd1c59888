"""S3 multipart uploads below the gateway: the store's records (both stores), and the
client over a real cluster (metadata + data servers in threads, both stores): aligned
parts are the file's chunks (completing copies nothing), unaligned ones are composed,
a part sent again replaces the first, an incomplete upload is invisible, and abort and
idle expiry free every chunk."""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import STORES, md5, meta_store_of, start_cluster
from reliability_util import stop_data_until_down

from stager import AsyncClient
from stager.client.uploads import MultipartUploads
from stager.config import load_config
from stager.errors import BadRequest, Forbidden, NotFound, UploadNotFound
from stager.meta.multipart import hidden_part_id
from stager.meta.store.base import MetaStore, NodeEntry
from stager.meta.store.multipart import MultipartRecord, PartRecord
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.meta.store.sqlite.store import SQLiteStore
from stager.protocol.models import LayoutSpec
from stager.testing import ThreadCluster
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
    return MultipartRecord(upload_id, path, file_id, LAYOUT, None, 1.0, touched,
                           extra=f'{{"of": "{upload_id}"}}')


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
    # a part placed around a down target keeps its own layout, and is collected in it
    c = await begun(store, "uc", "/b/c", "mc")
    own = replace(LAYOUT, targets=("t1", "t0"))
    hc = "hc".ljust(32, "0")
    await store.put_part("uc", replace(part(1, hc), layout=own))
    assert [p.layout for p in await store.list_parts("uc")] == [own]
    await store.drop_multipart("uc", keep=(), now=8.0)
    assert {g.file_id: g.layout for g in await store.take_garbage(10)
            if g.file_id in (hc, c.file_id)} == {hc: own, c.file_id: LAYOUT}


# -- the client over a real cluster (both stores) ---------------------------------------------
SMALL = 64 * 1024                           # chunk size: parts of 2 chunks are aligned
PART = 2 * SMALL
LAYOUT_SPEC = LayoutSpec(chunk_size=SMALL, stripe_count=3)


def chunk_files(cluster: ThreadCluster, file_id: str) -> list[str]:
    """Every chunk file of ``file_id`` on every data server's disk."""
    found = []
    for i in range(cluster.n):
        directory = cluster.root / f"data{i}" / "chunks" / file_id[:2] / file_id[2:4]
        if directory.exists():
            found += [p.name for p in directory.iterdir() if p.name.startswith(file_id)]
    return sorted(found)


async def eventually(check: Callable[[], bool], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        await asyncio.sleep(0.05)


@pytest.fixture(scope="module", params=STORES)
def mcluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
             slow_callbacks: object) -> Iterator[ThreadCluster]:
    """A cluster whose multipart minimum is one part of 2 chunks, and whose idle uploads
    go after 1.5 s."""
    c = start_cluster(tmp_path_factory.mktemp("mp"), meta_store=meta_store_of(request),
                      multipart_min_part=PART, multipart_idle=1.5)
    yield c
    c.stop()


@pytest.fixture
async def mp(mcluster: ThreadCluster) -> AsyncIterator[tuple[AsyncClient, MultipartUploads]]:
    async with AsyncClient(mcluster.meta_url, config=load_config(env={})) as c:
        yield c, MultipartUploads(c)


async def test_aligned_parts_complete_without_a_copy(mp, mcluster: ThreadCluster, ns: str,
                                                     payload) -> None:
    client, uploads = mp
    data = payload(3 * PART + 1000)
    pieces = [data[0:PART], data[PART:2 * PART], data[2 * PART:3 * PART], data[3 * PART:]]
    up = await uploads.create(f"{ns}/obj", layout=LAYOUT_SPEC)
    # the first, then the others out of order and at once, as boto3's threads send them
    await uploads.write_part(up.upload_id, 1, pieces[0], PART)
    parts = await asyncio.gather(*(uploads.write_part(up.upload_id, n, pieces[n - 1],
                                                      len(pieces[n - 1]))
                                   for n in (4, 3, 2)))
    assert [p.md5 for p in parts] == [md5(pieces[n - 1]) for n in (4, 3, 2)]
    # invisible until completed: stat, the listing and a read all say it is not there
    with pytest.raises(NotFound):
        await client.stat(f"{ns}/obj")
    assert await client.ls(ns) == [] if await client.exists(ns) else True
    listed = await uploads.parts(up.upload_id)
    assert [(p.number, p.size) for p in listed.parts] == [
        (1, PART), (2, PART), (3, PART), (4, 1000)]
    assert listed.upload.part_size == PART
    done = await uploads.complete(up.upload_id, [(n, f'"{md5(pieces[n - 1])}"')
                                                 for n in (1, 2, 3, 4)])
    # no copy: the file is the upload's own pending file, its chunks the parts' chunks
    assert done.copied == 0 and not done.composed and done.info.file_id == up.file_id
    assert done.etag == hashlib.md5(b"".join(bytes.fromhex(md5(p)) for p in pieces),
                                    usedforsecurity=False).hexdigest() + "-4"
    assert done.part_sizes == (PART, PART, PART, 1000)
    assert chunk_files(mcluster, up.file_id) == sorted(f"{up.file_id}.{i}" for i in range(7))
    assert await client.cat(f"{ns}/obj") == data
    assert (await uploads.uploads(f"{ns}/")).uploads == ()


async def test_a_short_last_part_sent_first_is_moved_into_its_slot(
        mp, mcluster: ThreadCluster, ns: str, payload) -> None:
    """Before any whole-chunk part fixed the part size, a short part cannot know its
    slot: it goes to a hidden file, and completing copies that part alone."""
    client, uploads = mp
    data = payload(2 * PART + 3)
    up = await uploads.create(f"{ns}/late", layout=LAYOUT_SPEC)
    await uploads.write_part(up.upload_id, 3, data[2 * PART:], 3)
    await uploads.write_part(up.upload_id, 2, data[PART:2 * PART], PART)
    await uploads.write_part(up.upload_id, 1, data[:PART], PART)
    done = await uploads.complete(up.upload_id, [
        (1, md5(data[:PART])), (2, md5(data[PART:2 * PART])), (3, md5(data[2 * PART:]))])
    assert done.copied == 3 and not done.composed and done.info.file_id == up.file_id
    assert await client.cat(f"{ns}/late") == data
    await eventually(lambda: chunk_files(mcluster, hidden_part_id(up.upload_id, 3)) == [])


async def test_unaligned_parts_are_composed_by_a_copy(mp, mcluster: ThreadCluster, ns: str,
                                                      payload) -> None:
    client, uploads = mp
    sizes = [PART + 5000, PART + 1, 7]          # no part a whole number of chunks
    data = payload(sum(sizes))
    cuts = [0, sizes[0], sizes[0] + sizes[1], len(data)]
    up = await uploads.create(f"{ns}/odd", layout=LAYOUT_SPEC)
    for n in (1, 2, 3):
        await uploads.write_part(up.upload_id, n, data[cuts[n - 1]:cuts[n]], sizes[n - 1])
    assert (await uploads.parts(up.upload_id)).upload.part_size is None
    done = await uploads.complete(up.upload_id, [(n, md5(data[cuts[n - 1]:cuts[n]]))
                                                 for n in (1, 2, 3)])
    assert done.composed and done.copied == len(data) and done.info.file_id != up.file_id
    assert await client.cat(f"{ns}/odd") == data
    # the pending file and the hidden parts are collected
    hidden = [hidden_part_id(up.upload_id, n) for n in (1, 2, 3)]
    await eventually(lambda: all(chunk_files(mcluster, f) == [] for f in hidden))
    assert (await uploads.uploads(f"{ns}/")).uploads == ()


async def test_a_part_sent_again_replaces_the_first(mp, mcluster: ThreadCluster, ns: str,
                                                    payload) -> None:
    client, uploads = mp
    first, second, last = payload(PART), bytes(PART), b"tail"
    up = await uploads.create(f"{ns}/again", layout=LAYOUT_SPEC)
    await uploads.write_part(up.upload_id, 1, first, PART)
    await uploads.write_part(up.upload_id, 2, last, 4)
    await uploads.write_part(up.upload_id, 1, second, PART)       # a retry, other bytes
    with pytest.raises(BadRequest) as stale:        # the first one's ETag is no part now
        await uploads.complete(up.upload_id, [(1, md5(first)), (2, md5(last))])
    assert stale.value.details["reason"] == "InvalidPart"
    done = await uploads.complete(up.upload_id, [(1, md5(second)), (2, md5(last))])
    assert done.copied == 0 and done.info.file_id == up.file_id
    assert await client.cat(f"{ns}/again") == second + last


async def test_completion_checks_parts_order_etags_and_sizes(mp, ns: str, payload) -> None:
    client, uploads = mp
    up = await uploads.create(f"{ns}/checked", layout=LAYOUT_SPEC)
    small, big = payload(SMALL), payload(PART)
    await uploads.write_part(up.upload_id, 1, small, SMALL)
    await uploads.write_part(up.upload_id, 2, big, PART)

    async def refused(parts: list[tuple[int, str]]) -> str:
        with pytest.raises(BadRequest) as exc:
            await uploads.complete(up.upload_id, parts)
        return str(exc.value.details["reason"])

    assert await refused([(2, md5(big)), (1, md5(small))]) == "InvalidPartOrder"
    assert await refused([(1, md5(small)), (3, md5(big))]) == "InvalidPart"
    assert await refused([(1, md5(big)), (2, md5(big))]) == "InvalidPart"
    assert await refused([(1, md5(small)), (2, md5(big))]) == "EntityTooSmall"
    with pytest.raises(BadRequest):                       # S3's part numbers: 1 to 10000
        await uploads.write_part(up.upload_id, 10001, b"x", 1)
    with pytest.raises(BadRequest):                       # fewer bytes than announced
        await uploads.write_part(up.upload_id, 3, b"xy", 3)
    assert [p.number for p in (await uploads.parts(up.upload_id)).parts] == [1, 2]
    with pytest.raises(NotFound):                         # nothing became visible
        await client.stat(f"{ns}/checked")
    # the last part may be small: part 2 alone completes
    done = await uploads.complete(up.upload_id, [(2, md5(big))])
    assert await client.cat(done.info.path) == big


async def test_abort_frees_every_chunk_and_refuses_more_parts(mp, mcluster: ThreadCluster,
                                                              ns: str, payload) -> None:
    client, uploads = mp
    up = await uploads.create(f"{ns}/gone", layout=LAYOUT_SPEC)
    await uploads.write_part(up.upload_id, 1, payload(PART), PART)
    await uploads.write_part(up.upload_id, 2, payload(SMALL + 3), SMALL + 3)   # in place
    await uploads.write_part(up.upload_id, 3, payload(PART + 3), PART + 3)     # hidden
    hidden = hidden_part_id(up.upload_id, 3)
    assert len(chunk_files(mcluster, up.file_id)) == 4 and len(chunk_files(mcluster, hidden)) == 3
    listed = await uploads.uploads(f"{ns}/")
    assert [u.upload_id for u in listed.uploads] == [up.upload_id]
    await uploads.abort(up.upload_id)
    await eventually(lambda: chunk_files(mcluster, up.file_id) == []
                     and chunk_files(mcluster, hidden) == [])
    with pytest.raises(UploadNotFound):
        await uploads.write_part(up.upload_id, 4, b"x", 1)
    with pytest.raises(UploadNotFound):
        await uploads.complete(up.upload_id, [(1, "0" * 32)])
    with pytest.raises(NotFound):
        await client.stat(f"{ns}/gone")


async def test_an_idle_upload_is_collected_after_multipart_idle(
        mp, mcluster: ThreadCluster, ns: str, payload) -> None:
    _, uploads = mp
    up = await uploads.create(f"{ns}/idle", layout=LAYOUT_SPEC)
    await uploads.write_part(up.upload_id, 1, payload(PART), PART)
    assert len(chunk_files(mcluster, up.file_id)) == 2
    await eventually(lambda: chunk_files(mcluster, up.file_id) == [])
    with pytest.raises(UploadNotFound):
        await uploads.parts(up.upload_id)


async def test_upload_part_copy_takes_a_range_of_another_file(mp, ns: str, payload) -> None:
    client, uploads = mp
    source = payload(3 * PART)
    await client.pipe(f"{ns}/src", source, layout=LAYOUT_SPEC)
    up = await uploads.create(f"{ns}/copied", layout=LAYOUT_SPEC)
    a = await uploads.copy_part(up.upload_id, 1, f"{ns}/src", PART, 2 * PART)
    b = await uploads.copy_part(up.upload_id, 2, f"{ns}/src", 10, 20)
    done = await uploads.complete(up.upload_id, [(1, a.md5), (2, b.md5)])
    assert done.copied == 0
    assert await client.cat(f"{ns}/copied") == source[PART:2 * PART] + source[10:20]


async def test_fsck_takes_no_part_of_an_upload_in_progress_for_an_orphan(
        mp, mcluster: ThreadCluster, ns: str, payload) -> None:
    client, uploads = mp
    up = await uploads.create(f"{ns}/fsck", layout=LAYOUT_SPEC)
    await uploads.write_part(up.upload_id, 1, payload(PART + 1), PART + 1)      # hidden
    await uploads.write_part(up.upload_id, 2, payload(PART), PART)              # in place
    hidden = hidden_part_id(up.upload_id, 1)
    assert len(chunk_files(mcluster, hidden)) == 3
    report = await client.fsck()
    named = {o["chunk"].split(".", 1)[0] for o in report["orphan_list"]}
    assert hidden not in named and up.file_id not in named
    await uploads.abort(up.upload_id)


@pytest.fixture(scope="module")
def acluster(tmp_path_factory: pytest.TempPathFactory,
             slow_callbacks: object) -> Iterator[ThreadCluster]:
    """A cluster with auth on (SQLite)."""
    c = start_cluster(tmp_path_factory.mktemp("mpauth"), auth=True, multipart_min_part=PART)
    yield c
    c.stop()


async def test_with_auth_a_token_writes_parts_only_under_its_prefixes(
        acluster: ThreadCluster, payload) -> None:
    """Every route checks the upload's path; parts reach the data servers with the
    capabilities the slots carry (in place, hidden, moved and composed alike)."""
    writer_token = acluster.mint(["write", "read"], ("/mine",))
    reader_token = acluster.mint(["read"])
    config = load_config(env={})
    async with AsyncClient(acluster.meta_url, config=config, token=writer_token) as mine, \
            AsyncClient(acluster.meta_url, config=config, token=reader_token) as reader:
        uploads = MultipartUploads(mine)
        data = payload(2 * PART + 3)
        aligned = await uploads.create("/mine/a", layout=LAYOUT_SPEC)
        await uploads.write_part(aligned.upload_id, 2, data[PART:], PART + 3)     # hidden
        await uploads.write_part(aligned.upload_id, 1, data[:PART], PART)         # in place
        done = await uploads.complete(aligned.upload_id, [
            (1, md5(data[:PART])), (2, md5(data[PART:]))])
        assert done.composed and await mine.cat("/mine/a") == data
        with pytest.raises(Forbidden):
            await uploads.create("/theirs/b", layout=LAYOUT_SPEC)
        other = await uploads.create("/mine/c", layout=LAYOUT_SPEC)
        theirs = MultipartUploads(reader)
        with pytest.raises(Forbidden):
            await theirs.write_part(other.upload_id, 1, b"x", 1)
        with pytest.raises(Forbidden):
            await theirs.abort(other.upload_id)
        assert [u.upload_id for u in (await theirs.uploads("/mine/")).uploads] == \
            [other.upload_id]
        await uploads.abort(other.upload_id)


async def test_a_last_part_longer_than_the_others_is_composed(mp, ns: str, payload) -> None:
    """It cannot lie in its slot (it would run into the next one's): the object is
    composed, and whole."""
    client, uploads = mp
    data = payload(2 * PART + SMALL)
    up = await uploads.create(f"{ns}/long", layout=LAYOUT_SPEC)
    await uploads.write_part(up.upload_id, 1, data[:PART], PART)
    await uploads.write_part(up.upload_id, 2, data[PART:], PART + SMALL)
    done = await uploads.complete(up.upload_id, [(1, md5(data[:PART])),
                                                 (2, md5(data[PART:]))])
    assert done.composed and done.copied == len(data)
    assert await client.cat(f"{ns}/long") == data


async def test_an_upload_outlives_upload_grace(tmp_path: Path, slow_callbacks: object,
                                               payload) -> None:
    """Ordinary pending writes are collected after upload_grace (0.3 s here); a
    multipart upload lives by multipart_idle, however long its parts take."""
    cluster = start_cluster(tmp_path / "grace", upload_grace=0.3, multipart_min_part=PART)
    try:
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as client:
            uploads = MultipartUploads(client)
            up = await uploads.create("/slow/obj", layout=LAYOUT_SPEC)
            first = payload(PART)
            await uploads.write_part(up.upload_id, 1, first, PART)
            plain, writer = await client.create("/slow/plain", layout=LAYOUT_SPEC)
            await asyncio.sleep(1.5)            # several collections past the grace
            # the plain pending write was collected; the multipart upload is whole
            with pytest.raises(NotFound):
                await client.commit(plain, writer)
            assert len(chunk_files(cluster, up.file_id)) == 2
            await uploads.write_part(up.upload_id, 2, b"end", 3)
            done = await uploads.complete(up.upload_id, [(1, md5(first)), (2, md5(b"end"))])
            assert done.copied == 0 and await client.cat("/slow/obj") == first + b"end"
    finally:
        cluster.stop()


async def test_parts_after_a_target_went_down_go_around_it(tmp_path: Path,
                                                           slow_callbacks: object,
                                                           payload) -> None:
    """A part is not rerouted mid-write, but once a target of the upload's layout is
    down, the next parts are placed on a layout of their own over the targets up, and
    completion composes the object (the earlier parts read from their replicas)."""
    cluster = start_cluster(tmp_path / "down", 3, replicas=2, multipart_min_part=PART)
    try:
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as client:
            uploads = MultipartUploads(client)
            up = await uploads.create("/down/obj", layout=LAYOUT_SPEC)
            data = payload(2 * PART + 7)
            await uploads.write_part(up.upload_id, 1, data[:PART], PART)
            gone = await stop_data_until_down(cluster, client, 0)
            await uploads.write_part(up.upload_id, 2, data[PART:2 * PART], PART)
            await uploads.write_part(up.upload_id, 3, data[2 * PART:], 7)
            hidden = [hidden_part_id(up.upload_id, n) for n in (2, 3)]
            assert all(chunk_files(cluster, f) for f in hidden)
            done = await uploads.complete(up.upload_id, [
                (1, md5(data[:PART])), (2, md5(data[PART:2 * PART])),
                (3, md5(data[2 * PART:]))])
            assert done.composed and gone not in (done.info.layout.targets or ())
            assert await client.cat("/down/obj") == data
    finally:
        cluster.stop()
