"""UploadPartCopy through the client layer (issue 29): a part copied from a range of
another file streams in buffers its reader lends and takes back, not a new zero-filled
one per chunk; the bytes must come out exact wherever the range starts (inside a
chunk: each piece copied into the writer's chunk; at a chunk boundary: whole chunks
sent from the lent buffers themselves)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from conftest import md5, start_cluster

from stager import AsyncClient
from stager.client.uploads import MultipartUploads
from stager.config import load_config
from stager.protocol.models import LayoutSpec
from stager.testing import ThreadCluster

SMALL = 64 * 1024                           # chunk size
PART = 4 * SMALL
LAYOUT_SPEC = LayoutSpec(chunk_size=SMALL, stripe_count=3)


@pytest.fixture(scope="module")
def mcluster(tmp_path_factory: pytest.TempPathFactory,
             slow_callbacks: object) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("mpcopy"), multipart_min_part=SMALL)
    yield c
    c.stop()


@pytest.fixture
async def client(mcluster: ThreadCluster) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(mcluster.meta_url, config=load_config(env={})) as c:
        yield c


@pytest.mark.parametrize("ranges", [
    # (start, stop) of each part in the source: inside chunks, across several
    [(SMALL - 1000, SMALL - 1000 + PART), (3 * SMALL + 17, 5 * SMALL + 5)],
    # at chunk boundaries: whole chunks go out from the lent buffers, uncopied
    [(0, PART), (PART, 2 * PART - 3)],
], ids=["unaligned", "aligned"])
async def test_a_copied_range_reads_back_byte_exact(client: AsyncClient, ns: str, payload,
                                                    ranges: list[tuple[int, int]]) -> None:
    source = payload(9 * SMALL + 123)
    await client.pipe(f"{ns}/src", source, layout=LAYOUT_SPEC)
    uploads = MultipartUploads(client)
    up = await uploads.create(f"{ns}/dst", layout=LAYOUT_SPEC)
    parts = []
    for number, (start, stop) in enumerate(ranges, 1):
        part = await uploads.copy_part(up.upload_id, number, f"{ns}/src", start, stop)
        assert (part.size, part.md5) == (stop - start, md5(source[start:stop]))
        parts.append((number, part.md5))
    await uploads.complete(up.upload_id, parts)
    assert await client.cat(f"{ns}/dst") == b"".join(source[a:b] for a, b in ranges)


async def test_lent_pieces_are_all_given_back_once_written(client: AsyncClient, ns: str,
                                                           payload) -> None:
    """A part from a lending source: every piece goes back to its lender, and only
    once the writer is done with it (its bytes are overwritten then: the part must
    still read back exact)."""
    data = payload(3 * SMALL + 500)
    lent: list[bytearray] = []
    back: list[bytearray] = []

    async def lending() -> AsyncIterator[memoryview]:
        for at in (0, SMALL, 2 * SMALL, 3 * SMALL):     # whole chunks, then a short one
            buf = bytearray(data[at:at + SMALL])
            lent.append(buf)
            yield memoryview(buf)

    def give_back(piece: memoryview) -> None:
        buf = piece.obj
        assert isinstance(buf, bytearray)
        back.append(buf)
        buf[:] = b"\xee" * len(buf)        # the lender reuses it at once

    uploads = MultipartUploads(client)
    up = await uploads.create(f"{ns}/lent", layout=LAYOUT_SPEC)
    part = await uploads.write_part(up.upload_id, 1, lending(), len(data),
                                    give_back=give_back)
    assert part.md5 == md5(data)
    assert sorted(map(id, back)) == sorted(map(id, lent))
    await uploads.complete(up.upload_id, [(1, part.md5)])
    assert await client.cat(f"{ns}/lent") == data
