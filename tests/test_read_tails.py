"""A run of ranged reads streams from its first byte (stager.dataplane.tails).

The gateway makes a new reader for every ranged GET; a range that ends before the
file reads on past its end, and the range that begins there takes those pieces
instead of reading them again.  Real servers on loopback (the module's cluster).
"""

from __future__ import annotations

import asyncio
from typing import Any

from stager import AsyncClient
from stager.protocol.models import LayoutSpec

CHUNK = 64 * 1024


def _requests(c: AsyncClient) -> int:
    return sum(t.requests for t in c.plane.counters.values())


async def _read(c: AsyncClient, info: Any, start: int, stop: int) -> bytes:
    return b"".join([bytes(p) async for p in c.reader(info).stream(start, stop)])


async def _settled(c: AsyncClient) -> None:
    """Until every parked read has finished."""
    for _ in range(500):
        if all(task.done() for task, _, _ in c.plane.tails.parked.values()):
            return
        await asyncio.sleep(0.01)


async def test_the_range_after_a_range_takes_what_it_read_on(aclient: AsyncClient, ns: str,
                                                             payload: Any) -> None:
    data = payload(6 * CHUNK + 123)
    await aclient.pipe(f"{ns}/f", data, layout=LayoutSpec(chunk_size=CHUNK))
    info = await aclient.stat(f"{ns}/f")
    tails = aclient.plane.tails
    at = 2 * CHUNK + 10                         # not on a chunk boundary
    assert await _read(aclient, info, 0, at) == data[:at]
    assert tails.has(info.file_id, at) and tails.has(info.file_id, 4 * CHUNK)
    await _settled(aclient)
    before, taken = _requests(aclient), tails.taken
    # [at, 4 CHUNK + 10): three pieces, all parked ([at, 3C), [3C, 4C), [4C, 4C+20));
    # it reads on from its own end only
    assert await _read(aclient, info, at, 4 * CHUNK + 10) == data[at:4 * CHUNK + 10]
    assert tails.taken - taken == 3
    assert not tails.has(info.file_id, at) and not tails.has(info.file_id, 4 * CHUNK)
    assert _requests(aclient) - before <= 3     # its read-on: [4C+10, 5C) .. the end
    await _settled(aclient)
    before = _requests(aclient)
    assert await _read(aclient, info, 4 * CHUNK + 10, len(data)) == data[4 * CHUNK + 10:]
    # parked: [4C+10, 5C), [5C, 6C), [6C, 6C+10) (as long as the range before), which
    # is too short for [6C, 6C+123): read again; nothing past the file's end
    assert _requests(aclient) - before == 1


async def test_no_read_on_where_a_read_began_or_the_file_ends(aclient: AsyncClient, ns: str,
                                                              payload: Any) -> None:
    data = payload(4 * CHUNK)
    await aclient.pipe(f"{ns}/g", data, layout=LayoutSpec(chunk_size=CHUNK))
    info = await aclient.stat(f"{ns}/g")
    tails = aclient.plane.tails
    # download_fileobj's ranges run at once: the second began before the first ended
    second = aclient.reader(info).stream(CHUNK, 2 * CHUNK)
    got = await anext(second)           # begun (and read) before the first range ends
    assert await _read(aclient, info, 0, CHUNK) == data[:CHUNK]
    assert not tails.has(info.file_id, CHUNK)
    assert bytes(got) == data[CHUNK:2 * CHUNK]
    await second.aclose()               # type: ignore[attr-defined]
    assert await _read(aclient, info, 2 * CHUNK, 4 * CHUNK) == data[2 * CHUNK:]
    assert not any(k[0] == info.file_id and k[1] >= 4 * CHUNK for k in tails.parked)


async def test_a_second_pass_over_the_ranges_reads_on_again(aclient: AsyncClient, ns: str,
                                                            payload: Any) -> None:
    """A range read before (its stream ended) does not keep the one before it from
    reading on: only a stream still running there does."""
    data = payload(4 * CHUNK)
    await aclient.pipe(f"{ns}/h", data, layout=LayoutSpec(chunk_size=CHUNK))
    info = await aclient.stat(f"{ns}/h")
    tails = aclient.plane.tails
    for _ in range(2):
        taken = tails.taken
        for at in range(0, len(data), CHUNK):
            assert await _read(aclient, info, at, at + CHUNK) == data[at:at + CHUNK]
            await _settled(aclient)
        assert tails.taken - taken == 3


async def test_a_random_range_does_not_read_on(aclient: AsyncClient, ns: str,
                                              payload: Any) -> None:
    """Only a run of ranges reads on: one range from the middle of the file, not
    where another ended, would read as much again for nothing."""
    data = payload(8 * CHUNK)
    await aclient.pipe(f"{ns}/r", data, layout=LayoutSpec(chunk_size=CHUNK))
    info = await aclient.stat(f"{ns}/r")
    tails = aclient.plane.tails
    assert await _read(aclient, info, 3 * CHUNK + 5, 4 * CHUNK) == data[3 * CHUNK + 5:4 * CHUNK]
    assert not any(k[0] == info.file_id for k in tails.parked)
    # the range that follows it is a run: it reads on
    assert await _read(aclient, info, 4 * CHUNK, 5 * CHUNK) == data[4 * CHUNK:5 * CHUNK]
    assert tails.has(info.file_id, 5 * CHUNK)
