"""Multipart parts placed by the writer without a begin request (issue 29): once the
upload's part size is fixed, a part of at most that size goes to its slot of the final
file without asking, so an upload of N parts makes about N + few metadata requests,
not 2N (parts sent at once before any is placed wait for one begin); the part's
record still refuses a part of an upload aborted meanwhile, and a part after this
client completed or aborted the upload asks (and is refused)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import STORES, md5, meta_store_of, start_cluster
from reliability_util import stop_data_until_down

from stager import AsyncClient
from stager.client.uploads import MultipartUploads, SlotCache
from stager.config import load_config
from stager.errors import BadRequest, NotFound, UploadNotFound
from stager.protocol.models import Layout, LayoutSpec
from stager.protocol.multipart import PartDone, PartSlot
from stager.protocol.routes import route
from stager.testing import ThreadCluster

SMALL = 64 * 1024                           # chunk size: parts of 2 chunks are aligned
PART = 2 * SMALL
LAYOUT_SPEC = LayoutSpec(chunk_size=SMALL, stripe_count=3)
PART_OPS = ("multipart_part_begin", "multipart_part_done")


@pytest.fixture(scope="module", params=STORES)
def mcluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
             slow_callbacks: object) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("nobegin"), meta_store=meta_store_of(request),
                      multipart_min_part=PART)
    yield c
    c.stop()


@pytest.fixture
async def client(mcluster: ThreadCluster) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(mcluster.meta_url, config=load_config(env={})) as c:
        yield c


async def counts(http, cluster: ThreadCluster) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """The part requests the metadata server answered, refused ones too (its /metrics)."""
    reply = await asyncio.to_thread(http, cluster.meta_url, "GET", "/metrics")
    out = dict.fromkeys(PART_OPS, 0.0)
    for op, value in re.findall(r'^stager_requests_total\{op="(\w+)",status="\d+"\} (\S+)$',
                                reply.body.decode(), re.M):
        if op in out:
            out[op] += float(value)
    return out


def grown(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    return {op: int(after[op] - before[op]) for op in PART_OPS}


async def test_n_parts_make_n_and_few_requests_not_2n(client: AsyncClient, http, ns: str,
                                                      mcluster: ThreadCluster,
                                                      payload) -> None:
    uploads = MultipartUploads(client)
    n = 12
    data = payload(n * PART - 5)
    pieces = [data[i:i + PART] for i in range(0, len(data), PART)]
    up = await uploads.create(f"{ns}/obj", layout=LAYOUT_SPEC)
    before = await counts(http, mcluster)
    await uploads.write_part(up.upload_id, 1, pieces[0], PART)      # fixes the part size
    for first in range(2, n + 1, 4):        # then four at a time, as boto3's threads send
        await asyncio.gather(*(uploads.write_part(up.upload_id, k, pieces[k - 1],
                                                  len(pieces[k - 1]))
                               for k in range(first, min(first + 4, n + 1))))
    after = await counts(http, mcluster)
    assert grown(before, after) == {"multipart_part_begin": 1, "multipart_part_done": n}
    done = await uploads.complete(up.upload_id, [(k, md5(p)) for k, p in enumerate(pieces, 1)])
    assert done.copied == 0 and not done.composed and done.info.file_id == up.file_id
    assert await client.cat(f"{ns}/obj") == data


async def test_a_first_wave_of_parts_sent_at_once_asks_one_begin(
        client: AsyncClient, http, ns: str, mcluster: ThreadCluster, payload) -> None:
    """boto3 sends its first ten parts at once, before any has a slot: they wait for
    the one begin on its way, which fixes the part size, and place themselves."""
    uploads = MultipartUploads(client)
    n = 6
    data = payload(n * PART)
    pieces = [data[i:i + PART] for i in range(0, len(data), PART)]
    up = await uploads.create(f"{ns}/wave", layout=LAYOUT_SPEC)
    before = await counts(http, mcluster)
    await asyncio.gather(*(uploads.write_part(up.upload_id, k, pieces[k - 1], PART)
                           for k in range(1, n + 1)))
    assert grown(before, await counts(http, mcluster)) == {
        "multipart_part_begin": 1, "multipart_part_done": n}
    done = await uploads.complete(up.upload_id, [(k, md5(p)) for k, p in enumerate(pieces, 1)])
    assert done.copied == 0 and not done.composed
    assert await client.cat(f"{ns}/wave") == data


async def test_a_part_whose_begin_was_skipped_is_refused_after_an_abort(
        client: AsyncClient, http, ns: str, mcluster: ThreadCluster, payload) -> None:
    uploads = MultipartUploads(client)
    up = await uploads.create(f"{ns}/aborted", layout=LAYOUT_SPEC)
    await uploads.write_part(up.upload_id, 1, payload(PART), PART)
    # another client aborts it: this one still holds the slot, fresh
    async with AsyncClient(mcluster.meta_url, config=load_config(env={})) as other:
        await MultipartUploads(other).abort(up.upload_id)
    before = await counts(http, mcluster)
    with pytest.raises(UploadNotFound):
        await uploads.write_part(up.upload_id, 2, payload(PART), PART)
    after = await counts(http, mcluster)
    assert grown(before, after)["multipart_part_begin"] == 0        # skipped: refused at record
    # the refusal dropped the slot: the next part asks, and is refused there
    assert uploads.slots.place(up.upload_id, 3, PART) is None
    with pytest.raises(UploadNotFound):
        await uploads.write_part(up.upload_id, 3, payload(PART), PART)
    assert grown(before, await counts(http, mcluster)) == {
        "multipart_part_begin": 1, "multipart_part_done": 1}
    with pytest.raises(NotFound):
        await client.stat(f"{ns}/aborted")


async def test_after_its_own_completion_a_part_asks_and_is_refused(
        client: AsyncClient, http, ns: str, mcluster: ThreadCluster, payload) -> None:
    uploads = MultipartUploads(client)
    first, last = payload(PART), b"tail"
    up = await uploads.create(f"{ns}/done", layout=LAYOUT_SPEC)
    await uploads.write_part(up.upload_id, 1, first, PART)
    await uploads.write_part(up.upload_id, 2, last, len(last))
    await uploads.complete(up.upload_id, [(1, md5(first)), (2, md5(last))])
    # a late part (a retry, say) of the completed upload: never written into the object
    assert MultipartUploads(client).slots.place(up.upload_id, 2, 3) is None
    before = await counts(http, mcluster)
    with pytest.raises(UploadNotFound):
        await uploads.write_part(up.upload_id, 2, b"bad", 3)
    assert grown(before, await counts(http, mcluster)) == {
        "multipart_part_begin": 1, "multipart_part_done": 0}
    assert await client.cat(f"{ns}/done") == first + last


async def test_a_larger_part_asks_and_a_misplaced_record_is_refused(
        client: AsyncClient, ns: str, payload) -> None:
    uploads = MultipartUploads(client)
    up = await uploads.create(f"{ns}/odd", layout=LAYOUT_SPEC)
    await uploads.write_part(up.upload_id, 1, payload(PART), PART)
    assert uploads.slots.place(up.upload_id, 2, PART + 1) is None   # hidden: asks begin
    slot = uploads.slots.place(up.upload_id, 3, PART)
    assert slot is not None and (slot.file_id, slot.first_chunk) == (up.file_id, 4)
    # the record checks the place a writer chose: part 3 does not go to chunk 2
    wrong = PartDone(up.file_id, 2, 1, md5(b"x"), (0,))
    with pytest.raises(BadRequest):
        await client.meta.request(route("multipart_part_done"), body=wrong.to_json(),
                                  upload_id=up.upload_id, number=3)


def test_the_cache_is_bounded_and_forgets_stale_and_closed_uploads() -> None:
    layout = Layout(SMALL, 1, 1, ("t0",), ("n0",))
    slot = PartSlot("f", 0, layout, {}, part_size=PART)
    cache = SlotCache(limit=2)
    cache.learn("a", slot, 0.0)                     # begun long ago: stale
    assert cache.place("a", 2, PART) is None
    now = time.monotonic()
    for upload in "bcd":
        cache.learn(upload, slot, now)
    assert cache.place("b", 2, PART) is None        # pushed out by c and d
    assert cache.place("d", 3, PART) == replace(slot, first_chunk=4)
    cache.close("d")
    cache.learn("d", slot, now)
    assert cache.place("d", 3, PART) is None        # closed here: never placed again
    cache.learn("e", replace(slot, part_size=None), now)
    assert cache.place("e", 1, 1) is None           # no part size: asks
    assert PartSlot.from_json(slot.to_json()) == slot
    assert "part_size" not in replace(slot, part_size=None).to_json()


async def test_a_part_placed_on_a_target_gone_down_asks_and_goes_around_it(
        tmp_path: Path, slow_callbacks: object, payload) -> None:
    """A part placed without asking fails on a target gone down since; from bytes, it
    is written again where begin says (around the target), and the slot is forgotten."""
    cluster = start_cluster(tmp_path / "down", 3, replicas=2, multipart_min_part=PART)
    try:
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as client:
            uploads = MultipartUploads(client)
            up = await uploads.create("/down/obj", layout=LAYOUT_SPEC)
            data = payload(2 * PART + 7)
            await uploads.write_part(up.upload_id, 1, data[:PART], PART)
            gone = await stop_data_until_down(cluster, client, 0)
            uploads.slots.seen(up.upload_id, time.monotonic())  # as if parts kept coming
            assert uploads.slots.place(up.upload_id, 2, PART) is not None
            await uploads.write_part(up.upload_id, 2, data[PART:2 * PART], PART)
            assert uploads.slots.place(up.upload_id, 3, 7) is None
            await uploads.write_part(up.upload_id, 3, data[2 * PART:], 7)
            done = await uploads.complete(up.upload_id, [
                (1, md5(data[:PART])), (2, md5(data[PART:2 * PART])),
                (3, md5(data[2 * PART:]))])
            assert done.composed and gone not in done.info.layout.targets
            assert await client.cat("/down/obj") == data
    finally:
        cluster.stop()
