"""Many byte ranges of many files: coalesced per chunk, fetched from every target at once.

Each wanted range is cut into chunk pieces.  Pieces of one chunk that overlap
or lie within ``max_gap`` bytes of each other become one read item.  The items
held by one target travel in batched requests (``POST /v1/read``, at most
``BATCH_BYTES`` each), and every target is asked at the same time.  A whole
chunk is checked against its committed CRC32C; a target that fails or sends a
bad chunk hands its items to the striped reader, which tries the replicas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..aio import gather_or_cancel
from ..checksum import crc32c
from ..dataplane.reader import FAILOVER_ERRORS
from ..errors import CorruptChunk
from ..layout import chunk_length, chunk_targets, pieces
from ..protocol.models import FileInfo, ReadItem, chunk_id

if TYPE_CHECKING:
    from ..client import AsyncClient

BATCH_BYTES = 16 << 20       # per request: several requests per target run in parallel
BATCH_ITEMS = 4096


@dataclass
class _Want:
    info: FileInfo
    start: int
    out: bytearray
    error: BaseException | None = None


@dataclass
class _Item:
    """``length`` bytes of chunk ``index`` of a file from ``offset``, serving ``parts``."""

    want_info: FileInfo
    index: int
    offset: int
    length: int
    parts: list[tuple[_Want, int, int, int]] = field(default_factory=list)
    # each part: (want, offset in the chunk, length, offset in want.out)

    @property
    def end(self) -> int:
        return self.offset + self.length


async def read_ranges(client: AsyncClient, wanted: Sequence[tuple[FileInfo, int, int]], *,
                      max_gap: int = 0) -> list[bytes | BaseException]:
    """The bytes ``[start, stop)`` of each ``(info, start, stop)``, in order.

    Bounds must already be clipped to the file.  A range that could not be
    read gets its exception in its place instead of bytes.
    """
    wants = [_Want(info, start, bytearray(max(0, stop - start))) for info, start, stop in wanted]
    items = _coalesce(wants, max_gap)
    by_target: dict[tuple[str, str], list[_Item]] = {}
    for item in items:
        layout = item.want_info.layout
        assert layout is not None
        target = client.plane.order_replicas(chunk_targets(layout, item.index))[0]
        url = item.want_info.locations.get(target, "")
        by_target.setdefault((target, url), []).append(item)
    jobs = [_serve_batch(client, target, url, batch)
            for (target, url), group in by_target.items() for batch in _batches(group)]
    await gather_or_cancel(jobs)
    return [w.error if w.error is not None else bytes(w.out) for w in wants]


def _coalesce(wants: list[_Want], max_gap: int) -> list[_Item]:
    """One item per run of close pieces of the same chunk."""
    per_chunk: dict[tuple[str, int], list[tuple[_Want, int, int, int]]] = {}
    infos: dict[str, FileInfo] = {}
    for want in wants:
        info = want.info
        assert info.layout is not None and info.file_id is not None
        infos[info.file_id] = info
        stop = want.start + len(want.out)
        for p in pieces(info.layout.chunk_size, info.size, want.start, stop):
            per_chunk.setdefault((info.file_id, p.index), []).append(
                (want, p.offset, p.length, p.file_offset - want.start))
    items: list[_Item] = []
    for (file_id, index), parts in per_chunk.items():
        parts.sort(key=lambda part: part[1])
        current: _Item | None = None
        for part in parts:
            _, offset, length, _ = part
            if current is None or offset > current.end + max_gap:
                current = _Item(infos[file_id], index, offset, length)
                items.append(current)
            else:
                current.length = max(current.end, offset + length) - current.offset
            current.parts.append(part)
    return items


def _batches(items: list[_Item]) -> list[list[_Item]]:
    out: list[list[_Item]] = [[]]
    size = 0
    for item in items:
        if out[-1] and (size + item.length > BATCH_BYTES or len(out[-1]) >= BATCH_ITEMS):
            out.append([])
            size = 0
        out[-1].append(item)
        size += item.length
    return out


async def _serve_batch(client: AsyncClient, target: str, url: str, items: list[_Item]) -> None:
    """Fetch one batch from its target; on failure, each item through the replicas."""
    buf = bytearray(sum(i.length for i in items))
    try:
        if not url:
            raise CorruptChunk(f"target {target} has no known address", target=target)
        reads = [ReadItem(chunk_id(_file_id(i), i.index), i.offset, i.length) for i in items]
        async with client.limit:
            await client.plane.batch_read_into(target, url, reads, memoryview(buf))
        pos = 0
        for item in items:
            _check_whole(item, memoryview(buf)[pos:pos + item.length], target)
            pos += item.length
    except FAILOVER_ERRORS:
        await gather_or_cancel(_fallback(client, item) for item in items)
        return
    pos = 0
    for item in items:
        _scatter(item, memoryview(buf)[pos:pos + item.length])
        pos += item.length


async def _fallback(client: AsyncClient, item: _Item) -> None:
    info = item.want_info
    assert info.layout is not None
    data = bytearray(item.length)
    try:
        start = item.index * info.layout.chunk_size + item.offset
        await client.reader(info).read_into(start, memoryview(data))
    except Exception as exc:  # reported in the place of every range the item serves
        for want, *_ in item.parts:
            want.error = exc
        return
    _scatter(item, memoryview(data))


def _check_whole(item: _Item, data: memoryview, target: str) -> None:
    info = item.want_info
    assert info.layout is not None
    sums = info.checksums
    whole = item.offset == 0 and item.length == chunk_length(info.layout.chunk_size, info.size,
                                                             item.index)
    if whole and sums is not None and item.index < len(sums) and crc32c(data) != sums[item.index]:
        raise CorruptChunk(f"chunk {item.index} of {info.path} from target {target} is corrupt",
                           target=target, path=info.path, chunk=item.index)


def _scatter(item: _Item, data: memoryview) -> None:
    for want, offset, length, dest in item.parts:
        src = offset - item.offset
        want.out[dest:dest + length] = data[src:src + length]


def _file_id(item: _Item) -> str:
    assert item.want_info.file_id is not None
    return item.want_info.file_id
