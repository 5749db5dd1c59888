"""The prefetch pipeline: fetches exactly the next batches' units on the I/O loop,
decodes and assembles them in a thread pool, hands batches over in order.

The plan is known before the first read: segment 0 is the current pass, and
segment ``k`` (asked for when the pipeline gets there) the ``k``-th epoch after
it, so prefetching runs on across epoch boundaries.  Batch ``j`` (numbered
across segments) starts as soon as the window allows: fewer than
``max_batches`` batches ahead of the consumer and the bytes held under
``max_bytes`` (the consumer's next batch is always admitted, so one batch
larger than the bound still goes through).

With ``fill`` the first batch is handed over only once the window is full
(every batch admitted before the first that must wait for the consumer is
built): a consumer paced just under the loader's rate would otherwise catch up
with the window while it is still filling, and wait a little at many of the
first epoch's batches (1.9-2.5 % of a paced loop's time at 80 % of the rate,
where later epochs, entered with the window full, waited 0.5 %).  The first
batch waits longer; the rest do not.

What the window holds (the batches planned, the units they use, their bytes)
is :class:`~.window.Window`'s; the units of consecutive batches are fetched
together, as one :class:`~.fetchgroup.FetchGroup`.

Threads: the coroutine runs on the I/O loop; decoding and ``map``/``collate``
run in the pool; the consumer blocks only in :meth:`Pipeline.get`, and only
when the batch it asks for is not ready yet (that wait is the *stall*).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..aio import cancel_and_wait
from .fetch import Fetcher
from .fetchgroup import FetchGroup, GroupBounds
from .formats import Index
from .options import Prefetch
from .spans import Spans
from .stats import Counters
from .window import Window

WARM_LEAD = 2           # batches asked for past the one being started, at least
WARM_FILES = 2048       # files whose capabilities one look-ahead asks for (a few groups'),
                        # and what is kept asked for past the batch being started
WARM_FIRST = 512        # files of the first look-ahead; each next one's twice, to WARM_FILES
WARM_UNDER_WAY = 4      # look-aheads under way at once, at most; and the batches kept asked
                        # for past the one being started are as many look-aheads' (under
                        # load a 2,048-file look-ahead came back in 70-250 ms: with two
                        # under way, reads past the first window met one still out)

#: (samples, unit of each, unit -> its value: the batch's units, maybe others too) -> batch
Assemble = Callable[[np.ndarray, np.ndarray, dict[int, Any]], Any]
#: segment number (1, 2, …) -> the sample ids of its batches, or None when there is none
Segments = Callable[[int], list[np.ndarray] | None]


class Pipeline:
    """Batches of ``first`` (then of further segments), fetched ahead of the consumer.

    ``blocks``: the order's shuffle blocks (first sample of each); a fetch group
    holds the batches drawing on the same blocks.  ``assemble_inline``: ``assemble``
    only arranges bytes already here, so it runs on the loop, which saves two
    thread hand-offs per batch (and the GIL passing between them)."""

    def __init__(self, index: Index, fetcher: Fetcher, first: list[np.ndarray], *,
                 loop: asyncio.AbstractEventLoop, pool: cf.Executor, prefetch: Prefetch,
                 assemble: Assemble, counters: Counters,
                 segments: Segments | None = None, blocks: np.ndarray | None = None,
                 assemble_inline: bool = False, fill: bool = False) -> None:
        self.index, self.fetcher, self.first, self.segments = index, fetcher, first, segments
        self.assemble_inline, self.blocks = assemble_inline, blocks
        self.loop, self.pool, self.prefetch = loop, pool, prefetch
        self.assemble, self.counters = assemble, counters
        self.window = Window(prefetch, counters)
        self.bounds = GroupBounds.of(prefetch)
        self.group = FetchGroup()
        self.groups = 0             # fetch groups sent so far
        self._warmed = 0            # batches before this one have had capabilities asked
        self._warm_batches = 0      # the most batches a look-ahead covered
        self._warm_requests = 0     # look-aheads asked for
        self._asking: list[asyncio.Future[Any]] = []     # the look-aheads under way
        self._slots: dict[int, cf.Future[Any]] = {}     # batch -> what the consumer gets
        self._lock = threading.Lock()
        self._wake: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._main: cf.Future[None] | None = None
        self._main_task: asyncio.Task[Any] | None = None
        self._launching = 0
        self._fetching = 0          # bytes of reads in flight
        # resolved (with the number of batches) once the window is full and built
        self.filled: cf.Future[int] | None = cf.Future() if fill else None
        self._filling = False

    # -- consumer side (any thread but the loop's) ------------------------------------
    def start(self) -> None:
        self._main = asyncio.run_coroutine_threadsafe(self._run(), self.loop)

    @property
    def launching(self) -> int:
        """The batch whose reads are being started now (the I/O's frontier)."""
        return self._launching

    def get(self, j: int) -> Any:
        """Batch ``j``; blocks until it is ready.  Call in order, each ``j`` once."""
        if j == 0 and self.filled is not None:
            cf.wait([self.filled])          # cancelled when the pipeline stops
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
        if self.filled is not None:
            self.filled.cancel()
        self.window.clear()
        with self._lock:
            for slot in self._slots.values():
                slot.cancel()     # wakes a consumer blocked in another thread

    async def _run(self) -> None:
        self._wake = asyncio.Event()
        self._main_task = asyncio.current_task()
        base, segment, batches = 0, 0, self.first
        try:
            if batches and self.fetcher.needs_capabilities():
                self._warm_first(batches)
            while batches:
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
            self._window_full(base)         # the plan ended before the window filled
        except Exception as exc:  # a bug of ours or of the format: hand it to the consumer
            self._fail_from(exc)

    async def _plan(self, base: int, batches: list[np.ndarray]) -> None:
        """Plan a segment's batches, off the loop: an epoch of a large dataset takes a while."""
        def plan() -> tuple[list[np.ndarray], Any]:
            units_of = [self.index.units_of(b) for b in batches]
            return units_of, self.window.plan(units_of)

        units_of, keys = await asyncio.to_thread(plan)
        self.window.add(base, batches, units_of, keys)

    async def _start_batch(self, j: int) -> None:
        """Admit batch ``j`` and add its new units to the fetch group; fetch the group
        first when the batch does not belong with it (see :meth:`_closes_group`)."""
        batch = self.window.batches[j]
        keys, new, units = self.window.new_keys(j)
        unit_ids = np.asarray(units, dtype=np.int64)
        spans = self.index.spans_of(unit_ids)
        sizes = spans.unit_sizes(unit_ids).tolist()
        alone = self.bounds.large(sum(sizes), len(new))
        blocks = None if self.blocks is None else \
            np.searchsorted(self.blocks, batch.samples, side="right")
        near = self.group.near(blocks)
        if self.group.batches:
            split = self._closes_group(j, sum(sizes), bool(new), alone, near)
            if split is not None:
                if split:
                    # The batch's samples in the group's blocks go with the group (the
                    # rest of its chunks), the others start the next group: a chunk
                    # split between two groups would be read in fragments, twice.
                    assert blocks is not None
                    new, units, sizes, spans, blocks = self._give_inside(
                        j, blocks, new, units, sizes, spans)
                await self._flush()
                near = None
                if split and not new:       # all of it went with the group
                    self._spawn(self._build(j, keys))
                    return
        # A new group waits for room for a whole group, so that groups stay whole
        # once the window is full (the consumer's next batch never waits).
        await self._admit(j, sum(sizes), 1 if self.group.batches else
                          min(self.bounds.batches(self.groups),
                              max(1, self.prefetch.batches // 2)))
        self._join(new, units, sizes, spans)
        if blocks is not None:
            self.group.add_blocks(blocks, near)
        self.group.batches += 1
        self._spawn(self._build(j, keys))
        if alone or self.group.batches >= self.bounds.batches(self.groups):
            await self._flush()

    def _closes_group(self, j: int, need: int, new: bool, alone: bool,
                      near: np.ndarray | None) -> bool | None:
        """Whether batch ``j`` (its ``new`` units ``need`` bytes) ends the group: None
        when it joins it; else whether its samples in the group's blocks join it first."""
        far = near is not None and near.mean() < 0.5
        full = self.bounds.full(self.group.need + need, far, near)
        waits = self.window.must_wait(j, need, 1)
        if not (alone or full or waits or far):
            return None
        return new and not (alone or waits) and near is not None and bool(near.any())

    def _join(self, keys: list[int], units: list[int], sizes: list[int], spans: Spans) -> None:
        """Add units (their keys, sizes and extents) to the fetch group, held from now."""
        ready = self.group.join(keys, units, spans, sum(sizes), self.loop)
        self.window.hold(keys, sizes, ready)

    def _give_inside(self, j: int, blocks: np.ndarray, new: list[int], units: list[int],
                     sizes: list[int], spans: Spans
                     ) -> tuple[list[int], list[int], list[int], Spans, np.ndarray]:
        """Join batch ``j``'s new units lying in the group's blocks to the group (the
        batch is admitted: it fits the window); return the rest, and their blocks."""
        inside = self.group.inside(blocks)
        close = set(self.window.batches[j].keys[inside].tolist())
        mine = [k in close for k in new]
        give = [i for i, m in enumerate(mine) if m]
        keep = [i for i, m in enumerate(mine) if not m]
        given = np.asarray([units[i] for i in give], dtype=np.int64)
        kept = np.asarray([units[i] for i in keep], dtype=np.int64)
        self._join([new[i] for i in give], given.tolist(), [sizes[i] for i in give],
                   spans.of_units(given))
        return ([new[i] for i in keep], kept.tolist(), [sizes[i] for i in keep],
                spans.of_units(kept), blocks[~inside])

    async def _flush(self) -> None:
        """Fetch the group's units in one go (see :mod:`.fetchgroup`)."""
        group, self.group = self.group, FetchGroup()
        self.groups += 1
        if group.keys and group.ready is not None:
            # Groups of small samples go two at a time: the next group's reads are
            # out while the last group's batches are built and taken.  One at a
            # time, the data servers sat idle for about a quarter of each group's
            # cycle, from its last chunk in to the next group's first request out.
            large = self.bounds.large(group.need, len(group.keys))
            # Its capabilities (auth on) while earlier groups' reads are still out:
            # those of the next several groups at once (the read engine asks for any
            # a group still lacks when its reads start).
            if self.fetcher.needs_capabilities():
                self._warm_ahead(max(0, self._launching - group.batches))
            await self._admit_fetch(group.need, 1 if large else 2)
            self._fetching += group.need
            self._spawn(self._fetch(group))

    def _warm_ahead(self, first: int) -> None:
        """Ask for capabilities ahead (:meth:`.Fetcher.warm_ahead`), so that no group's
        reads wait for them but the first window's.  The first request holds the first
        group's files and :data:`WARM_FIRST` more, each next one twice the files of the
        one before up to :data:`WARM_FILES`; :data:`WARM_UNDER_WAY` are under way at
        most (the metadata server answers the first, small ones sooner), the next asked
        for as one comes back, until :meth:`_warm_lead` batches past the one being
        started are asked for.  What the group being fetched (from batch ``first``)
        still lacks after the first request goes alone: its reads wait for it.
        Asked for only once the frontier was :data:`WARM_LEAD` batches away, the next
        group's reads met the fetch under way: ~2 stalls per look-ahead, 0.2-0.7 s of
        stalls in an 8,192-file epoch of 1.5-3 s under load."""
        start = max(self._warmed, first)
        upto = self._launching + self._warm_lead()
        while start <= upto:
            own = start <= self._launching      # the group's: its reads wait for these
            self._asking = [f for f in self._asking if not f.done()]
            if not own and len(self._asking) >= WARM_UNDER_WAY:
                return
            # the first look-aheads grow as the first groups do; the very first also
            # holds the first group's files
            most = min(WARM_FILES, WARM_FIRST << self._warm_requests)
            alone = own and self._warm_requests > 0
            parts, files, at = [], 0, start
            while (batch := self.window.batches.get(at)) is not None:
                mine = at <= self._launching
                if (alone and not mine) or (files >= most and not mine):
                    break
                rows = self.index.spans_of(np.unique(batch.units)).file
                parts.append(rows)
                files += len(rows)
                at += 1
            if not parts:
                return                          # the window has no more batches planned
            self._warmed = start = at
            if alone:
                self.fetcher.warm_ahead(parts)
            else:
                self._ask(parts)

    def _warm_first(self, batches: list[np.ndarray]) -> None:
        """Ask for the first window's capabilities before it is planned (the plan of a
        large epoch takes a while, and the first reads waited for it and then for the
        answer): the look-aheads :meth:`_warm_ahead` would ask for at the first group's
        fetch, the first group's files and more, :data:`WARM_FIRST` in all, then twice that,
        … (:data:`WARM_UNDER_WAY` under way at most) over the window's batches.
        :meth:`_warm_ahead` goes on from there.  (The first group's files alone in a
        request of their own would be answered sooner, but its batch capabilities
        would split each data server's files further, and with ``fill`` batch 0 waits
        for the whole window anyway.)"""
        def rows(batch: np.ndarray) -> np.ndarray:
            return self.index.spans_of(np.unique(self.index.units_of(batch))).file

        own, at = self.bounds.batches(0), 0
        end = min(len(batches), self.prefetch.batches + 1)
        while at < end and len(self._asking) < WARM_UNDER_WAY:
            most = min(WARM_FILES, WARM_FIRST << self._warm_requests)
            parts, files = [], 0
            while at < len(batches) and (files < most or at < own):
                parts.append(rows(batches[at]))
                files += len(parts[-1])
                at += 1
            self._ask(parts)
        self._warmed = at

    def _ask(self, parts: list[np.ndarray]) -> None:
        """One look-ahead request for ``parts`` (batches' file rows), counted; as it
        comes back, :meth:`_warm_ahead` asks for the next."""
        fetches = self.fetcher.warm_ahead(parts)
        self._warm_batches = max(self._warm_batches, len(parts))
        self._warm_requests += 1
        if fetches:
            asking = asyncio.gather(*fetches, return_exceptions=True)
            asking.add_done_callback(lambda _: self._warm_ahead(self._launching + 1))
            self._asking.append(asking)

    def _warm_lead(self) -> int:
        """Batches past the one being started to have asked for: :data:`WARM_UNDER_WAY`
        look-aheads' (or a window's) past the next group (whose reads start before
        :meth:`_warm_ahead` is called again), so that a look-ahead answered late is still
        in before the reads that need it: with one look-ahead's lead, reads past the first
        window met the next one still under way (2 stalls of 70 ms in one of three traced
        8,192-file epochs under load; tests/test_auth_stalls.py's slow case)."""
        return max(WARM_LEAD, WARM_UNDER_WAY * self._warm_batches, self.prefetch.batches) \
            + self.bounds.batches(self.groups)

    async def _admit(self, j: int, need: int, batches: int) -> None:
        assert self._wake is not None
        while self.window.must_wait(j, need, batches):
            self._window_full(j)
            self._wake.clear()
            await self._wake.wait()

    async def _admit_fetch(self, need: int, groups: int = 1) -> None:
        """Wait until ``need`` more bytes of reads fit in ``groups`` times the
        fetcher's ``bytes_in_flight`` (or none are in flight: a batch larger than
        that still goes).  So the window is fetched in order, a few batches at a time:
        fetched all at once, its batches would share the bandwidth and the next
        one would arrive as late as the last."""
        assert self._wake is not None
        bound = self.prefetch.fetch.bytes_in_flight * groups
        while self._fetching and self._fetching + need > bound:
            self._wake.clear()
            await self._wake.wait()

    def _window_full(self, j: int) -> None:
        """Batches ``0 … j-1`` fill the window: resolve :attr:`filled` once they are built."""
        filled = self.filled
        if filled is None or filled.done() or self._filling:
            return
        self._filling = True
        slots = [asyncio.wrap_future(self._slot(i)) for i in range(j)]

        async def built() -> None:
            if slots:
                await asyncio.wait(slots)
            if not filled.done():
                filled.set_result(j)
        self._spawn(built())

    def _fetched(self, size: int) -> None:
        self._fetching -= size
        if self._wake is not None:
            self._wake.set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fetch(self, group: FetchGroup) -> None:
        """Fetch the group's units; resolve its future with each unit's value."""
        ready = group.ready
        assert ready is not None
        try:
            start = time.perf_counter()
            try:
                values = await self._read(group)
            finally:
                self._fetched(group.need)
            self.counters.add_fetch(time.perf_counter() - start, group.need)
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if self.index.decodes:
            self.window.resize(group.keys, [self.index.nbytes(v) for v in values])
        if not ready.done():
            ready.set_result(dict(zip(group.units, values, strict=True)))

    async def _read(self, group: FetchGroup) -> list[Any]:
        """Each unit's value: its fetched bytes, decoded in the pool when the format
        decodes."""
        spans, units = group.spans(), np.asarray(group.units, dtype=np.int64)
        values = self.index.per_unit(units, spans, await self.fetcher.fetch(spans))
        if not self.index.decodes:
            return values
        return list(await asyncio.gather(*(
            self.loop.run_in_executor(self.pool, self._decode, unit, value)
            for unit, value in zip(group.units, values, strict=True))))

    def _decode(self, unit: int, value: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.index.decode(unit, value)
        finally:
            self.counters.add_decode(time.perf_counter() - start)

    async def _build(self, j: int, keys: list[int]) -> None:
        slot = self._slot(j)
        batch = self.window.batches[j]
        # Take every future before the first await: a later batch that uses one of
        # these keys last may finish first and drop it.
        units, futures = self.window.futures(keys)
        groups = dict.fromkeys(futures)             # a fetch group's future or two
        assert None not in groups, "a unit was dropped before its last batch"
        try:
            for f in groups:
                await f                             # type: ignore[misc]
            if len(groups) == 1:        # unit -> value of the group's units, this batch's too
                decoded = futures[0].result()       # type: ignore[union-attr]
            else:
                decoded = {u: f.result()[u]         # type: ignore[union-attr]
                           for u, f in zip(units, futures, strict=True)}
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
        self.window.built(j)

    def _assemble(self, samples: np.ndarray, units: np.ndarray, decoded: dict[int, Any]) -> Any:
        start = time.perf_counter()
        try:
            return self.assemble(samples, units, decoded)
        finally:
            self.counters.add_decode(time.perf_counter() - start)

    def _consumed_upto(self, n: int) -> None:
        self.window.consumed_upto(n)
        if self._wake is not None:
            self._wake.set()

    def _fail_from(self, exc: BaseException) -> None:
        if self.filled is not None and not self.filled.done():
            self.filled.set_result(0)       # the consumer meets the error at its batch
        slot = self._slot(self._launching)
        if not slot.done():
            slot.set_exception(exc)
