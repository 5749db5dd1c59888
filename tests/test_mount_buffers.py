"""The mount's chunk buffers and the per-file chunk cache, against a real cluster
(no FUSE needed: the cache is what the mount's ``read`` calls)."""

from __future__ import annotations

import asyncio

import pytest

from stager import AsyncClient
from stager.mount import buffers
from stager.mount.buffers import HUGE_PAGE, BufferPool, allocate
from stager.mount.cache import ChunkCache, cache_slots
from stager.protocol.models import LayoutSpec

MiB = 1 << 20


def test_buffers_are_writable_and_start_on_a_huge_page() -> None:
    big = allocate(4 * MiB)
    assert len(big) == 4 * MiB and big.flags.writeable
    assert big.ctypes.data % HUGE_PAGE == 0
    memoryview(big)[-3:] = b"end"
    assert bytes(big[-3:]) == b"end"
    small = allocate(1000)
    assert len(small) == 1000 and small.flags.writeable


async def test_pool_reuses_last_in_first_out_within_its_bound() -> None:
    pool = BufferPool(max_bytes=8 * MiB)
    a, b, c = (pool.take(4 * MiB) for _ in range(3))
    assert pool.allocated == 3
    for buf in (a, b, c):
        pool.give(buf)                      # c does not fit in 8 MiB: let go
    assert pool.nbytes == 8 * MiB
    assert pool.take(4 * MiB) is b and pool.take(4 * MiB) is a
    assert pool.nbytes == 0 and pool.allocated == 3
    pool.take(1000)                         # another length: a new buffer
    assert pool.allocated == 4


async def test_an_idle_pool_lets_its_buffers_go(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buffers, "IDLE_TRIM", 0.05)
    pool = BufferPool(max_bytes=8 * MiB)
    pool.give(pool.take(MiB))
    assert pool.nbytes == MiB
    await asyncio.sleep(0.3)
    assert pool.nbytes == 0


async def test_a_buffer_still_in_use_is_never_filled_again(aclient: AsyncClient, ns: str,
                                                           payload) -> None:
    data = payload(12 * MiB)
    await aclient.pipe(f"{ns}/f", data, layout=LayoutSpec(chunk_size=MiB))
    info = await aclient.stat(f"{ns}/f")
    pool = BufferPool(max_bytes=64 * MiB)

    async def refresh():  # noqa: ANN202
        return aclient.reader(info)

    cache = ChunkCache(aclient.reader(info), readahead=1, refresh=refresh, pool=pool)
    held = await cache.read(0, 4096)        # a view the caller has not let go of
    for off in range(4096, len(data), 256 * 1024):
        assert bytes(await cache.read(off, 256 * 1024)) == data[off:off + 256 * 1024]
    # Chunks went round the pool (far fewer buffers than chunks), but not chunk 0's.
    assert pool.allocated <= cache_slots(1) + 2 < len(data) // MiB
    assert bytes(held) == data[:4096]
    cache.close()
    del held
