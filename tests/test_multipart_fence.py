"""A late part cannot change a completed multipart object (issue 29).

Two clients share an upload.  One completes it; the other then writes a part into the
object's chunks: placed from its slot cache without a begin, or begun before the
completion and written after it.  Completing seals the object's chunks at every data
server that holds them (a chunk write with other bytes is refused from then on), so the
late part is refused at the data server, not only at its record, and the object reads
back exactly as completed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from conftest import md5, start_cluster
from reliability_util import stop_data_until_down

from stager import AsyncClient
from stager.client import uploads as uploads_module
from stager.client.uploads import MultipartUploads
from stager.config import load_config
from stager.data.seals import Seals
from stager.dataplane.writer import StripedWriter
from stager.errors import BadRequest, Unavailable, UploadNotFound
from stager.protocol.models import LayoutSpec
from stager.protocol.multipart import PartBegin, PartSlot
from stager.protocol.routes import route
from stager.testing import ThreadCluster

SMALL = 64 * 1024
PART = 2 * SMALL
LAYOUT_SPEC = LayoutSpec(chunk_size=SMALL, stripe_count=3, replicas=2)


@pytest.fixture(scope="module")
def fcluster(tmp_path_factory: pytest.TempPathFactory,
             slow_callbacks: object) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("fence"), multipart_min_part=PART)
    yield c
    c.stop()


@pytest.fixture
async def two(fcluster: ThreadCluster) -> AsyncIterator[tuple[AsyncClient, AsyncClient]]:
    async with AsyncClient(fcluster.meta_url, config=load_config(env={})) as a, \
            AsyncClient(fcluster.meta_url, config=load_config(env={})) as b:
        yield a, b


def other_bytes(data: bytes) -> bytes:
    return bytes(x ^ 0x5A for x in data)


async def write_at(client: AsyncClient, slot: PartSlot, data: bytes) -> None:
    """A part's chunk writes into ``slot``, as a writer holding it sends them."""
    client.learn("write", slot.file_id, slot.capability)
    writer = StripedWriter(client.plane, slot.file_id, slot.layout, slot.locations,
                           first_chunk=slot.first_chunk)
    try:
        await writer.write(data)
        await writer.close()
    except BaseException:
        await writer.abort()
        raise


async def completed(b: AsyncClient, upload_id: str, first: bytes, last: bytes) -> None:
    uploads = MultipartUploads(b)
    await uploads.write_part(upload_id, 2, last, len(last))
    await uploads.complete(upload_id, [(1, md5(first)), (2, md5(last))])


async def test_a_part_placed_without_begin_after_another_completion_is_refused(
        two: tuple[AsyncClient, AsyncClient], ns: str, payload,
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    monkeypatch.setattr(uploads_module, "FRESH", 600.0)  # the slot stays usable however slow
    first, last = payload(PART), payload(PART // 2 + 7)
    mine = MultipartUploads(a)
    up = await mine.create(f"{ns}/obj", layout=LAYOUT_SPEC)
    await mine.write_part(up.upload_id, 1, first, PART)     # A learns the upload's slots
    await completed(b, up.upload_id, first, last)           # B completes it
    assert mine.slots.place(up.upload_id, 1, PART) is not None
    with pytest.raises(UploadNotFound):                     # A's late part 1, no begin
        await mine.write_part(up.upload_id, 1, other_bytes(first), PART)
    assert await b.cat(f"{ns}/obj") == first + last
    assert await a.cat(f"{ns}/obj") == first + last


async def test_a_part_begun_before_another_completion_and_written_after_is_refused(
        two: tuple[AsyncClient, AsyncClient], ns: str, payload) -> None:
    a, b = two
    first, last = payload(PART), payload(PART // 2 + 7)
    mine = MultipartUploads(a)
    up = await mine.create(f"{ns}/obj", layout=LAYOUT_SPEC)
    await mine.write_part(up.upload_id, 1, first, PART)
    # A begins part 2 again (a retry, say); B completes before A's bytes go out
    slot = PartSlot.from_json(await a.meta.request(
        route("multipart_part_begin"), body=PartBegin(PART).to_json(),
        upload_id=up.upload_id, number=2))
    assert slot.file_id == up.file_id and slot.first_chunk == 2
    await completed(b, up.upload_id, first, last)
    with pytest.raises(UploadNotFound):
        await write_at(a, slot, payload(PART))      # over the object's last chunk and past it
    with pytest.raises(UploadNotFound):
        await write_at(a, PartSlot(up.file_id, 0, slot.layout, slot.locations,
                                   slot.capability), other_bytes(first))
    assert await b.cat(f"{ns}/obj") == first + last


async def test_the_same_bytes_again_are_taken_after_completion(
        two: tuple[AsyncClient, AsyncClient], ns: str, payload) -> None:
    """A sealed chunk written again with its own bytes (a repair, a lost answer's retry)
    is taken: the seal refuses other bytes, not a copy."""
    a, b = two
    first, last = payload(PART), payload(PART // 2 + 7)
    mine = MultipartUploads(a)
    up = await mine.create(f"{ns}/obj", layout=LAYOUT_SPEC)
    slot = PartSlot.from_json(await a.meta.request(
        route("multipart_part_begin"), body=PartBegin(PART).to_json(),
        upload_id=up.upload_id, number=1))
    await mine.write_part(up.upload_id, 1, first, PART)
    await completed(b, up.upload_id, first, last)
    await write_at(a, slot, first)
    assert await b.cat(f"{ns}/obj") == first + last


async def test_a_part_stored_unrecorded_before_the_seal_fails_the_completion(
        two: tuple[AsyncClient, AsyncClient], ns: str, payload) -> None:
    """Part 1 written again (other bytes) but not yet recorded when another client
    completes: the seal finds its chunks, and the completion refuses (503) rather than
    commit an object whose chunks are not the recorded part's; the seal is lifted, the
    part's record goes through, and completing with its new ETag gives its bytes."""
    a, b = two
    first, last = payload(PART), payload(PART // 2 + 7)
    again = other_bytes(first)
    mine = MultipartUploads(a)
    up = await mine.create(f"{ns}/obj", layout=LAYOUT_SPEC)
    await mine.write_part(up.upload_id, 1, first, PART)
    slot = PartSlot.from_json(await a.meta.request(
        route("multipart_part_begin"), body=PartBegin(PART).to_json(),
        upload_id=up.upload_id, number=1))
    await write_at(a, slot, again)                          # stored, not recorded yet
    theirs = MultipartUploads(b)
    await theirs.write_part(up.upload_id, 2, last, len(last))
    with pytest.raises(Unavailable):
        await theirs.complete(up.upload_id, [(1, md5(first)), (2, md5(last))])
    await mine.write_part(up.upload_id, 1, again, PART)     # recorded: the seal is lifted
    with pytest.raises(BadRequest):                         # S3's InvalidPart
        await theirs.complete(up.upload_id, [(1, md5(first)), (2, md5(last))])
    await theirs.complete(up.upload_id, [(1, md5(again)), (2, md5(last))])
    assert await b.cat(f"{ns}/obj") == again + last


async def test_a_seal_outlives_a_restart_and_its_release_lifts_it(tmp_path: Path) -> None:
    seals = Seals(tmp_path)
    seals.store("a" * 32, *await seals.seal("a" * 32, 2, {0: 7, 1: 9}))
    again = Seals(tmp_path)                     # the target restarted
    again.check([("a" * 32 + ".0", 7), ("b" * 32 + ".5", 1)])  # its own bytes; another file
    for chunk, crc in (("a" * 32 + ".0", 8), ("a" * 32 + ".2", 7)):
        with pytest.raises(UploadNotFound):
            again.check([(chunk, crc)])
    again.remove(again.release(["a" * 32]))
    Seals(tmp_path).check([("a" * 32 + ".0", 8)])


async def test_a_completion_seals_the_copies_in_reach_when_a_target_is_down(
        tmp_path: Path, slow_callbacks: object, payload) -> None:
    """With a target down, each chunk still has a copy sealed and confirmed on a target
    up (replicas 2): the object completes in place and reads whole; with replicas 1 the
    chunks on the down target have no copy in reach, and completing waits (503)."""
    for replicas in (2, 1):
        cluster = start_cluster(tmp_path / f"r{replicas}", 3, replicas=replicas,
                                multipart_min_part=PART)
        try:
            async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
                uploads = MultipartUploads(c)
                spec = LayoutSpec(chunk_size=SMALL, stripe_count=3, replicas=replicas)
                up = await uploads.create("/d/obj", layout=spec)
                first, last = payload(PART), payload(PART + 1)[:PART - 3]
                await uploads.write_part(up.upload_id, 1, first, PART)
                await uploads.write_part(up.upload_id, 2, last, len(last))
                await stop_data_until_down(cluster, c, 0)
                parts = [(1, md5(first)), (2, md5(last))]
                if replicas == 1:
                    with pytest.raises(Unavailable):
                        await uploads.complete(up.upload_id, parts)
                    continue
                done = await uploads.complete(up.upload_id, parts)
                assert not done.composed and done.copied == 0
                assert await c.cat("/d/obj") == first + last
        finally:
            cluster.stop()
