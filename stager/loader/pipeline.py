"""The prefetch pipeline: fetches exactly the next batches' units on the I/O loop,
decodes and assembles them in a thread pool, hands batches over in order.

The plan is known before the first read: segment 0 is the current pass, and
segment ``k`` (asked for when the pipeline gets there) the ``k``-th epoch after
it, so prefetching runs on across epoch boundaries.  Batch ``j`` (numbered
across segments) starts as soon as the window allows: fewer than
``max_batches`` batches ahead of the consumer and the bytes held under
``max_bytes`` (the consumer's next batch is always admitted, so one batch
larger than the bound still goes through).

A unit shared by several batches (a Parquet row group, a zarr chunk row) is
fetched and decoded once and held while its uses follow each other within the
prefetch window; a use further away (another epoch, a wide shuffle) fetches it
again, so memory stays bounded whatever the order.  These runs of uses are the
*keys* the pipeline tracks (:func:`plan_keys`).

Threads: the coroutine runs on the I/O loop; decoding and ``map``/``collate``
run in the pool; the consumer blocks only in :meth:`Pipeline.get`, and only
when the batch it asks for is not ready yet (that wait is the *stall*).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..aio import cancel_and_wait
from .fetch import Buffer, Extent, Fetcher
from .formats import Index
from .spans import Spans
from .stats import Counters

Assemble = Callable[[np.ndarray, np.ndarray, dict[int, Any]], Any]
#: segment number (1, 2, …) -> the sample ids of its batches, or None when there is none
Segments = Callable[[int], list[np.ndarray] | None]


@dataclass
class _Batch:
    samples: np.ndarray
    units: np.ndarray        # unit of each sample
    keys: np.ndarray         # key (unit + run of uses) of each sample


@dataclass(frozen=True)
class Limits:
    max_batches: int = 6
    max_bytes: int = 256 << 20


def plan_keys(units_of: Sequence[np.ndarray], horizon: int, first_key: int
              ) -> tuple[list[np.ndarray], dict[int, int], dict[int, list[int]]]:
    """Keys of a segment's units: one per run of uses no more than ``horizon`` batches
    apart.  Returns (keys per batch, key -> unit, batch -> keys it uses last)."""
    if not units_of:
        return [], {}, {}
    lengths = [len(u) for u in units_of]
    units = np.concatenate(units_of).astype(np.int64)
    batch = np.repeat(np.arange(len(units_of), dtype=np.int64), lengths)
    order = np.lexsort((batch, units))                  # by unit, then batch
    su, sb = units[order], batch[order]
    new = np.ones(len(su), dtype=bool)
    new[1:] = (su[1:] != su[:-1]) | (sb[1:] - sb[:-1] > horizon)
    starts = np.nonzero(new)[0]
    key_sorted = np.cumsum(new) - 1 + first_key
    keys = np.empty_like(key_sorted)
    keys[order] = key_sorted
    last_batch = np.maximum.reduceat(sb, starts)
    unit_of = dict(zip(range(first_key, first_key + len(starts)), su[starts].tolist(),
                       strict=True))
    release: dict[int, list[int]] = {}
    for key, j in zip(unit_of, last_batch.tolist(), strict=True):
        release.setdefault(j, []).append(key)
    return np.split(keys, np.cumsum(lengths)[:-1]), unit_of, release


class Pipeline:
    """Batches of ``first`` (then of further segments), fetched ahead of the consumer."""

    def __init__(self, index: Index, fetcher: Fetcher, first: list[np.ndarray], *,
                 loop: asyncio.AbstractEventLoop, pool: cf.Executor, limits: Limits,
                 assemble: Assemble, counters: Counters,
                 segments: Segments | None = None, blocks: np.ndarray | None = None,
                 assemble_inline: bool = False) -> None:
        self.index, self.fetcher, self.first, self.segments = index, fetcher, first, segments
        # ``assemble`` only arranges bytes already here: run it on the loop, which
        # saves two thread hand-offs per batch (and the GIL passing between them)
        self.assemble_inline = assemble_inline
        # the order's shuffle blocks (first sample of each): a fetch group holds the
        # batches drawing on the same blocks
        self.blocks = blocks
        self.loop, self.pool, self.limits = loop, pool, limits
        self.assemble, self.counters = assemble, counters
        self._batches: dict[int, _Batch] = {}
        self._release: dict[int, list[int]] = {}
        # Per key of a unit fetched or being fetched (plain dicts of numbers and
        # futures: no object per unit for the garbage collector to walk): the
        # bytes it holds against the bound, and its fetch group's future
        # (key -> decoded unit), None once its last batch is built.
        self._held_of: dict[int, int] = {}
        self._unit_of: dict[int, int] = {}          # key -> unit, for keys planned
        self._ready: dict[int, asyncio.Future[dict[int, Any]] | None] = {}
        self._slots: dict[int, cf.Future[Any]] = {}
        self._lock = threading.Lock()
        self._consumed = 0
        self._held = 0
        self._next_key = 0
        self._wake: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._main: cf.Future[None] | None = None
        self._main_task: asyncio.Task[Any] | None = None
        self._launching = 0
        self._fetching = 0          # bytes of reads in flight
        # the fetch group: units of consecutive batches not fetched yet (their keys,
        # and their extents: a Spans per batch, or a list of extents per unit)
        self._group: list[int] = []
        self._group_reads: list[Any] = []
        self._group_blocks: np.ndarray | None = None
        self._group_need = 0
        self._group_batches = 0
        self._groups = 0
        self._group_ready: asyncio.Future[dict[int, Any]] | None = None
        # A group's reads land in request buffers before they become samples, so
        # for a moment they take twice their size: a quarter of the window at most.
        # Past ``bytes_in_flight`` a group takes only batches drawing on its own
        # blocks (the rest of its shuffle window, which would otherwise be read
        # in fragments by two groups).
        self._group_limit = max(1, limits.max_bytes // 4)
        self._group_bytes = max(1, min(fetcher.options.bytes_in_flight, self._group_limit))

    # -- consumer side (any thread but the loop's) ------------------------------------
    def start(self) -> None:
        self._main = asyncio.run_coroutine_threadsafe(self._run(), self.loop)

    def get(self, j: int) -> Any:
        """Batch ``j``; blocks until it is ready.  Call in order, each ``j`` once."""
        slot = self._slot(j)
        result = slot.result()
        with self._lock:
            self._slots.pop(j, None)
        self.loop.call_soon_threadsafe(self._consumed_upto, j + 1)
        return result

    def stop(self, wait: bool = True) -> None:
        """Cancel whatever is in flight; with ``wait``, until it has stopped."""
        main = self._main
        if main is None:
            return
        self._main = None
        if self.loop.is_closed():
            return
        done = asyncio.run_coroutine_threadsafe(self._shutdown(main), self.loop)
        if wait:
            done.result()

    def _slot(self, j: int) -> cf.Future[Any]:
        with self._lock:
            slot = self._slots.get(j)
            if slot is None:
                slot = self._slots[j] = cf.Future()
            return slot

    # -- I/O loop side --------------------------------------------------------------------
    async def _shutdown(self, main: cf.Future[None]) -> None:
        main.cancel()
        tasks = list(self._tasks)
        if self._main_task is not None:
            tasks.append(self._main_task)
        await cancel_and_wait(tasks)
        self._held_of.clear()
        self._ready.clear()
        self._batches.clear()
        self._held = 0
        with self._lock:
            for slot in self._slots.values():
                slot.cancel()     # wakes a consumer blocked in another thread

    async def _run(self) -> None:
        self._wake = asyncio.Event()
        self._main_task = asyncio.current_task()
        base, segment, batches = 0, 0, self.first
        try:
            while batches:
                # planned off the loop: an epoch of a large dataset takes a while
                await self._plan(base, batches)
                for j in range(base, base + len(batches)):
                    self._launching = j
                    await self._start_batch(j)
                await self._flush()
                base += len(batches)
                segment += 1
                if self.segments is None:
                    break
                batches = await asyncio.to_thread(self.segments, segment) or []
        except Exception as exc:  # a bug of ours or of the format: hand it to the consumer
            self._fail_from(exc)

    async def _plan(self, base: int, batches: list[np.ndarray]) -> None:
        def plan() -> tuple[list[np.ndarray], list[np.ndarray], dict[int, int],
                            dict[int, list[int]]]:
            units_of = [self.index.units_of(b) for b in batches]
            return units_of, *plan_keys(units_of, self.limits.max_batches, first_key)

        first_key = self._next_key
        units_of, keys_of, unit_of, release = await asyncio.to_thread(plan)
        self._next_key += len(unit_of)
        self._unit_of.update(unit_of)
        for jj, (samples, units, keys) in enumerate(zip(batches, units_of, keys_of,
                                                       strict=True)):
            self._batches[base + jj] = _Batch(samples, units, keys)
        for jj, keys in release.items():
            self._release[base + jj] = keys

    async def _start_batch(self, j: int) -> None:
        """Admit batch ``j`` and add its new units to the fetch group (see :meth:`_flush`)."""
        batch = self._batches[j]
        keys = list(dict.fromkeys(batch.keys.tolist()))
        new = [k for k in keys if k not in self._held_of]
        units = [self._unit_of[k] for k in new]
        reads: Any
        if self.index.one_extent:           # planned as arrays, one extent per unit
            reads = self.index.spans_of(np.asarray(units, dtype=np.int64))
            sizes = reads.length.tolist()
        else:
            reads = self.index.extents_of(units)
            sizes = [sum(e.length for e in ex) for ex in reads]
        need = sum(sizes)
        # Large samples are read whole chunks at a time anyway: grouping their
        # batches would only make the next batch share its bandwidth.
        alone = self._large(need, len(new))
        blocks = None if self.blocks is None else \
            np.searchsorted(self.blocks, batch.samples, side="right")
        near = self._near(blocks)
        if self._group_batches:
            far = near is not None and near.mean() < 0.5
            size = self._group_need + need
            full = size > self._group_limit or (size > self._group_bytes
                                                and (near is None or far))
            waits = self._must_wait(j, need, 1)
            if alone or full or waits or far:
                split = bool(new) and not (alone or waits) and near is not None \
                    and bool(near.any()) and self.index.one_extent and blocks is not None
                if split:
                    # The batch's samples in the group's blocks go with the group (the
                    # rest of its chunks), the others start the next group: a chunk
                    # split between two groups would be read in fragments, twice.
                    new, sizes, reads, blocks = self._give_inside(batch, blocks, new, sizes,
                                                                  reads)
                    need = sum(sizes)
                await self._flush()
                near = None
                if split and not new:       # all of it went with the group
                    self._spawn(self._build(j, keys))
                    return
        # A new group waits for room for a whole group, so that groups stay whole
        # once the window is full (the consumer's next batch never waits).
        await self._admit(j, need, 1 if self._group_batches else
                          min(self._group_size(), max(1, self.limits.max_batches // 2)))
        self._join(new, sizes, reads)
        if blocks is not None:
            self._group_blocks = np.unique(blocks) if near is None else \
                np.union1d(self._group_blocks, blocks[near])
        self._group_batches += 1
        self._spawn(self._build(j, keys))
        if alone or self._group_batches >= self._group_size():
            await self._flush()

    def _join(self, new: list[int], sizes: list[int], reads: Any) -> None:
        """Add units (their keys, sizes and reads) to the fetch group, held from now."""
        if new and self._group_ready is None:
            self._group_ready = self.loop.create_future()
            self._group_ready.add_done_callback(_retrieve)
        self._held_of.update(zip(new, sizes, strict=True))
        self._ready.update(dict.fromkeys(new, self._group_ready))
        need = sum(sizes)
        self._held += need
        self.counters.note_held(self._held)
        if new:
            self._group.extend(new)
            self._group_reads.append(reads)
        self._group_need += need

    def _give_inside(self, batch: _Batch, blocks: np.ndarray, new: list[int],
                     sizes: list[int], reads: Spans
                     ) -> tuple[list[int], list[int], Spans, np.ndarray]:
        """Join the batch's new units lying in the group's blocks to the group (the
        batch is admitted: it fits the window); return the rest, and their blocks.
        Only the group's own blocks count here, not the ones right after them
        (see :meth:`_near`): in a shuffled order those belong to another window."""
        inside = np.isin(blocks, self._group_blocks)
        close = set(batch.keys[inside].tolist())
        mine = np.fromiter((k in close for k in new), dtype=bool, count=len(new))
        give, keep = np.flatnonzero(mine), np.flatnonzero(~mine)
        self._join([new[i] for i in give], [sizes[i] for i in give], reads.take(give))
        return ([new[i] for i in keep], [sizes[i] for i in keep], reads.take(keep),
                blocks[~inside])

    def _near(self, blocks: np.ndarray | None) -> np.ndarray | None:
        """Which of a batch's samples (given by block) lie in or right after the
        blocks the group reads from; None when there is no group to compare with.

        When most do not, the order has moved on to the next shuffle window, and a
        group spanning both windows would read half of each one's chunks, in
        fragments: the batch starts a new group.  Samples in the block right after
        one of the group's count as near, so an unshuffled order, moving from a
        block to the next, keeps its groups; only the near samples' blocks join
        the group's, so a batch straddling two windows does not pull the next
        window's blocks into it."""
        if blocks is None or self._group_blocks is None or not len(blocks):
            return None
        return np.isin(blocks, self._group_blocks) | np.isin(blocks - 1, self._group_blocks)

    def _group_size(self) -> int:
        """Batches per fetch group at most: 1, 1, 2, 4, … up to three quarters of
        the window (the first batch comes soonest; past the start, a group usually
        ends where the order moves on to the next shuffle window)."""
        return min(1 << max(0, self._groups - 1), max(1, self.limits.max_batches * 3 // 4))

    async def _flush(self) -> None:
        """Fetch the group's units in one go.

        Consecutive batches of a two-level shuffle read the same few blocks, so
        the pieces of a group's batches lie next to each other and merge into a
        few long ranges (whole chunks, when the group covers a shuffle window),
        where each batch alone would read scattered samples."""
        keys, need, ready = self._group, self._group_need, self._group_ready
        reads = self._group_reads
        self._group, self._group_need, self._group_batches = [], 0, 0
        self._group_reads, self._group_ready = [], None
        self._group_blocks = None
        self._groups += 1
        if keys and ready is not None:
            # Groups of small samples go two at a time: the next group's reads are
            # out while the last group's batches are built and taken.  One at a
            # time, the data servers sat idle for about a quarter of each group's
            # cycle, from its last chunk in to the next group's first request out.
            await self._admit_fetch(need, 1 if self._large(need, len(keys)) else 2)
            self._fetching += need
            self._spawn(self._fetch(keys, need, ready, reads))

    def _large(self, need: int, units: int) -> bool:
        """Whether ``units`` units of ``need`` bytes are large samples (read with
        striped readahead, a batch at a time, never grouped)."""
        return need >= self.fetcher.options.stream_above * max(1, units)

    def _must_wait(self, j: int, need: int, batches: int) -> bool:
        """Whether batch ``j`` (with room for ``batches`` from it) must wait for the consumer."""
        return j > self._consumed and (
            j + batches - 1 - self._consumed >= self.limits.max_batches
            or self._held + need > self.limits.max_bytes)

    async def _admit(self, j: int, need: int, batches: int) -> None:
        assert self._wake is not None
        while self._must_wait(j, need, batches):
            self._wake.clear()
            await self._wake.wait()

    async def _admit_fetch(self, need: int, groups: int = 1) -> None:
        """Wait until ``need`` more bytes of reads fit in ``groups`` times the
        fetcher's ``bytes_in_flight`` (or none are in flight: a batch larger than
        that still goes).  So the window is fetched in order, a few batches at a time:
        fetched all at once, its batches would share the bandwidth and the next
        one would arrive as late as the last."""
        assert self._wake is not None
        bound = self.fetcher.options.bytes_in_flight * groups
        while self._fetching and self._fetching + need > bound:
            self._wake.clear()
            await self._wake.wait()

    def _fetched(self, size: int) -> None:
        self._fetching -= size
        if self._wake is not None:
            self._wake.set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fetch(self, keys: list[int], size: int, ready: asyncio.Future[dict[int, Any]],
                     reads: list[Any]) -> None:
        """Fetch the group's units: ``reads`` holds a Spans per batch (one extent per
        unit: each unit's value is its bytes) or a list of extents per unit."""
        try:
            start = time.perf_counter()
            try:
                if self.index.one_extent:
                    decoded = await self.fetcher.fetch(Spans.concat(reads))
                else:
                    decoded = await self._fetch_extents([ex for r in reads for ex in r],
                                                        [self._unit_of[k] for k in keys])
            finally:
                self._fetched(size)
            self.counters.add_fetch(time.perf_counter() - start, size)
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if self.index.decodes:
            for k, value in zip(keys, decoded, strict=True):
                held = self._held_of.get(k)
                if held is not None:
                    size = self.index.nbytes(value)
                    self._held += size - held
                    self._held_of[k] = size
            self.counters.note_held(self._held)
        if not ready.done():
            ready.set_result(dict(zip(keys, decoded, strict=True)))

    async def _fetch_extents(self, extents: list[list[Extent]], units: list[int]) -> list[Any]:
        """Each unit's buffers (one per extent), decoded when the format decodes."""
        buffers = await self.fetcher.fetch([e for ex in extents for e in ex])
        parts, at = [], 0
        for ex in extents:
            parts.append(buffers[at:at + len(ex)])
            at += len(ex)
        del buffers
        if not self.index.decodes:
            return parts
        return list(await asyncio.gather(*(
            self.loop.run_in_executor(self.pool, self._decode, unit, p)
            for unit, p in zip(units, parts, strict=True))))

    def _decode(self, unit: int, buffers: list[Buffer]) -> Any:
        start = time.perf_counter()
        try:
            return self.index.decode(unit, buffers)
        finally:
            self.counters.add_decode(time.perf_counter() - start)

    async def _build(self, j: int, keys: list[int]) -> None:
        slot = self._slot(j)
        batch = self._batches[j]
        # Take every future before the first await: a later batch that uses one of
        # these keys last may finish first and drop it.
        unit_of, ready = self._unit_of, self._ready
        units = [unit_of[k] for k in keys]
        futures = [ready[k] for k in keys]
        groups = {id(f): f for f in futures}      # a fetch group's future or two
        assert None not in groups.values(), "a unit was dropped before its last batch"
        try:
            for f in groups.values():
                await f
            if len(groups) == 1:
                got = futures[0].result()   # type: ignore[union-attr]
                decoded = {u: got[k] for k, u in zip(keys, units, strict=True)}
            else:
                decoded = {u: f.result()[k]  # type: ignore[union-attr]
                           for k, u, f in zip(keys, units, futures, strict=True)}
            if self.assemble_inline:
                result = self._assemble(batch.samples, batch.units, decoded)
            else:
                result = await self.loop.run_in_executor(
                    self.pool, self._assemble, batch.samples, batch.units, decoded)
        except asyncio.CancelledError:
            slot.cancel()
            raise
        except BaseException as exc:
            if not slot.done():
                slot.set_exception(exc)
            return
        if not slot.done():
            slot.set_result(result)
        # The batch holds what it needs now; drop the units it used last, so memory
        # is the batch, not the batch twice (their bytes stay counted until the
        # consumer takes it).
        for k in self._release.get(j, ()):
            if k in self._ready:
                self._ready[k] = None

    def _assemble(self, samples: np.ndarray, units: np.ndarray, decoded: dict[int, Any]) -> Any:
        start = time.perf_counter()
        try:
            return self.assemble(samples, units, decoded)
        finally:
            self.counters.add_decode(time.perf_counter() - start)

    def _consumed_upto(self, n: int) -> None:
        for j in range(self._consumed, n):
            self._batches.pop(j, None)
            for k in self._release.pop(j, ()):
                self._held -= self._held_of.pop(k, 0)
                self._ready.pop(k, None)
                self._unit_of.pop(k, None)
        self._consumed = max(self._consumed, n)
        if self._wake is not None:
            self._wake.set()

    def _fail_from(self, exc: BaseException) -> None:
        slot = self._slot(self._launching)
        if not slot.done():
            slot.set_exception(exc)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a unit's error as seen: the batch that needed it reports it."""
    if not future.cancelled():
        future.exception()
