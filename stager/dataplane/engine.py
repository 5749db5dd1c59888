"""The one executor of read plans: per target, whole chunks or batched pieces, failover.

Every read of committed file bytes ends here (plans: :mod:`.readplan`).  Each
round, every chunk with pieces still to read goes to its first replica not yet
tried (:meth:`DataPlane.order_replicas`: recently failed targets last), and the
pieces each target holds are read as follows, decided in :meth:`ReadEngine._kind`
and nowhere else:

- a chunk of at least ``stream_above`` bytes that the pieces cover mostly is
  read whole with ``GET`` (``sendfile`` on the server) and checked here against
  its CRC32C: straight into the caller's buffer when one piece is the whole
  chunk (or a buffer of its own, when that piece is handed out as bytes), else
  into a reused buffer the pieces are copied out of;
- everything else is merged per chunk (``merge_gap``) into ranges that travel
  in batched requests (route ``batch_read``, at most ``max_request_bytes`` each),
  checked block by block on the server; a whole small chunk inside is checked
  here against its committed CRC32C.

Chunks of cached (attached) files are filled first, through the metadata server
(``DataPlane.fill``), unless the client learnt their CRC32Cs from an earlier fill
(:mod:`.learnt`): those are read straight from the data servers and reported in bulk
afterwards.  A target that has not one of them (evicted since) puts those of its
request in doubt: they are forgotten and filled, then read, at once.

A request that fails (unreachable, corrupt, missing, storage error) hands its
chunks to their next replica; a silent target is given up after the short
``failover_timeout`` while another replica is left.  When every replica failed,
the round is retried after a pause (unless every replica sent bad bytes), and
then each chunk still unread gets one error, from :func:`final_error`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import numpy as np

from ..aio import gather_or_cancel
from ..checksum import crc32c
from ..errors import ChunkNotFound, CorruptChunk, StagerError, StorageError, TargetUnavailable
from ..protocol.batch import MAX_BATCH_ITEMS
from ..protocol.models import ReadItem
from .failover import Failover, final_error
from .readplan import Chunks, FileTable, ReadOptions, ReadPlan
from .transport import DataPlane, unknown_target

# Errors after which another replica may still have good bytes.
FAILOVER_ERRORS = (TargetUnavailable, CorruptChunk, ChunkNotFound, StorageError)
_SHIFT = 40            # chunk row << _SHIFT + offset: one sortable position
RANGED, WHOLE, DIRECT = 0, 1, 2    # how a chunk's pieces are read (ReadEngine._kind)
FEW_CHUNKS = 4         # up to this many, routed on plain ints (ReadEngine._route)
FILL_WINDOW = 16       # chunks of cached files filled, then read, at a time (those
                       # whose CRC32C was learnt earlier are read without a fill)

Buffer = bytes | bytearray | memoryview
Outcome = tuple[np.ndarray, StagerError | None]     # the pieces a request served, its error
Job = Callable[[], Awaitable[None]]
T = TypeVar("T")


class ReadEngine:
    """Executes read plans against the data plane; holds the reused whole-chunk buffers."""

    def __init__(self, plane: DataPlane, limit: asyncio.Semaphore,
                 options: ReadOptions | None = None) -> None:
        self.plane = plane
        self.limit = limit
        self.options = options or ReadOptions()
        self._spare: dict[int, list[bytearray]] = {}     # whole-chunk buffers, by size

    async def read_extents(self, table: FileTable, file: np.ndarray, offset: np.ndarray,
                           length: np.ndarray, *, raise_errors: bool = True,
                           ) -> list[Any]:
        """The bytes of each extent (``length[i]`` bytes of file ``file[i]`` from
        ``offset[i]``), in order; with ``raise_errors=False`` an extent that could
        not be read gets its error in its place.  Each extent becomes ``bytes`` as
        soon as its own read is done (copied out of the request buffer, which is
        freed at once), so a batch never sits in memory twice."""
        plan = table.plan(file, offset, length)
        await self.plane.warm("read", table.file_ids_by_target(file))
        out: list[Any] = [b""] * len(file)
        split = np.unique(plan.dest[~plan.alone]).tolist()
        for d in split:
            out[d] = bytearray(int(length[d]))
        failed = await self.run(plan, out, raise_errors=raise_errors)
        for d in split:
            out[d] = bytes(out[d])
        for d, error in failed.items():
            out[d] = error
        return out

    async def run(self, plan: ReadPlan, out: list[Any], *,
                  raise_errors: bool = True) -> dict[int, StagerError]:
        """Read every piece of ``plan`` into ``out`` (a buffer per destination, or
        ``None`` where the piece is ``alone``: it becomes ``bytes``).  Raises the
        first chunk's error, or with ``raise_errors=False`` returns the error of
        each destination that could not be read."""
        cached = plan.chunks.cached
        state = Failover(plan)
        if cached.any():
            rows = np.flatnonzero(cached).tolist()
            state.recalled = self._recall(plan.chunks, rows)
            unknown = [c for c in rows if c not in state.recalled]
            if len(unknown) > FILL_WINDOW:
                return await self._run_parts(plan, out, raise_errors)
            if unknown:
                await self._fill(plan, state, unknown)
        kinds = self._route(plan)
        await self._rounds(plan, out, kinds, state)
        while state.doubt:      # read by a learnt CRC32C, and missing: evicted since?
            await self._ask_again(plan, out, kinds, state)
        if state.recalled:
            self._report(plan, state)
        for _ in range(self.options.retries if state.left else 0):
            # (no numpy call where every piece was read: the common case)
            stuck = np.unique(plan.chunk[~state.done]).tolist()
            again = [c for c in stuck if cached[c] and c not in state.dead]
            if not again:
                break
            # evicted, or its copies lost, since the fill: fetched anew
            state.tried.clear()
            await self._fill(plan, state, again, again=set(again))
            await self._rounds(plan, out, kinds, state)
        done = state.done
        if not state.left:
            return {}
        failed = {c: final_error(plan.chunks.name[c], state.errors.get(c, []))
                  for c in np.unique(plan.chunk[~done]).tolist()}
        if raise_errors:
            raise next(iter(failed.values()))
        return {int(d): failed[c] for d, c in zip(plan.dest[~done].tolist(),
                                                   plan.chunk[~done].tolist(), strict=True)}

    def _recall(self, chunks: Chunks, rows: list[int]) -> set[int]:
        """Chunks ``rows`` (of cached files) whose CRC32C this client learnt from an
        earlier fill (:mod:`.learnt`): set in ``chunks``, and read without asking."""
        learnt = self.plane.learnt
        if learnt is None or not len(learnt):
            return set()
        known = [(c, crc) for c in rows if (crc := learnt.crc(chunks.name[c])) is not None]
        if known:
            chunks.filled([c for c, _ in known], [crc for _, crc in known])
        return {c for c, _ in known}

    async def _ask_again(self, plan: ReadPlan, out: list[Any], kinds: list[int],
                         state: Failover) -> None:
        """The chunks in doubt (read by a learnt CRC32C, a target had not one of them)
        forgotten and asked of the metadata server (which fetches those evicted), then
        read: a miss, as a read without a learnt CRC32C would have been from the start."""
        doubt = sorted(state.doubt)
        state.doubt.clear()
        state.recalled.difference_update(doubt)
        for c in doubt:
            state.tried.pop(c, None)
            state.errors.pop(c, None)
        assert self.plane.learnt is not None
        self.plane.learnt.forget([plan.chunks.name[c] for c in doubt])
        await self._fill(plan, state, doubt)
        await self._rounds(plan, out, kinds, state)

    def _report(self, plan: ReadPlan, state: Failover) -> None:
        """The chunks read by a learnt CRC32C, whole, queued to be reported (they count
        as hits, and as used, for eviction)."""
        bounds, done = plan.bounds.tolist(), state.done
        read = [plan.chunks.name[c] for c in sorted(state.recalled)
                if done[bounds[c]:bounds[c + 1]].all()]
        assert self.plane.learnt is not None
        self.plane.learnt.read(read)

    async def _run_parts(self, plan: ReadPlan, out: list[Any], raise_errors: bool
                         ) -> dict[int, StagerError]:
        """A plan touching many chunks of cached files, run ``FILL_WINDOW`` chunks at a
        time: each part filled, then read, before the next is filled (a plan larger
        than the cache would otherwise evict its own first chunks before reading them)."""
        failed: dict[int, StagerError] = {}
        n = len(plan.chunks.name)
        for a in range(0, n, FILL_WINDOW):
            got = await self.run(plan.part(a, min(n, a + FILL_WINDOW)), out,
                                 raise_errors=raise_errors)
            for d, error in got.items():
                failed.setdefault(d, error)
        return failed

    async def _rounds(self, plan: ReadPlan, out: list[Any], kinds: list[int],
                      state: Failover) -> None:
        """Rounds over every replica, with a pause between, until each piece is read,
        the retries are spent, or only hopeless chunks are left."""
        retries = self.options.retries
        for attempt in range(retries + 1):
            await self._round(plan, out, kinds, state, last=attempt == retries)
            if not state.left:
                return
            stuck = np.unique(plan.chunk[~state.done]).tolist()
            if attempt == retries or all(state.hopeless(c) or c in state.doubt
                                         for c in stuck):
                return
            state.tried.clear()
            await asyncio.sleep(0.1 * 2 ** attempt)

    async def _fill(self, plan: ReadPlan, state: Failover, rows: list[int],
                    again: set[int] | frozenset[int] = frozenset()) -> None:
        """Have chunks ``rows`` of cached files filled, their CRC32Cs learnt; a file
        whose fill failed (its source down, the file gone) has its chunks given up
        with that error."""
        chunks = plan.chunks
        items = chunks.fill_items(rows, again)
        answers = await self.plane.fill(items)
        learnt = self.plane.learnt
        by_file: dict[str, list[int]] = {}
        for c in rows:
            by_file.setdefault(chunks.name[c].rsplit(".", 1)[0], []).append(c)
        for item, answer in zip(items, answers, strict=True):
            mine = by_file[item.file_id]
            if isinstance(answer, StagerError):
                state.give_up(mine, answer)
            else:
                chunks.filled(mine, answer.crc)
                if learnt is not None:
                    learnt.learn([chunks.name[c] for c in mine], answer.crc)

    def _route(self, plan: ReadPlan) -> list[int]:
        """How each chunk's pieces are read (DIRECT, WHOLE or RANGED), worked out
        with numpy for many chunks and on plain ints for the few of a striped
        read (where each numpy call costs more than the arithmetic)."""
        bounds = plan.bounds
        if len(bounds) > FEW_CHUNKS + 1:
            first = bounds[:-1]
            return self._kind(np.diff(bounds), plan.offset[first], plan.length[first],
                              plan.chunks.full, plan.chunks.known,
                              np.add.reduceat(plan.length, first)).tolist()
        b = bounds.tolist()
        offset, length = plan.offset.tolist(), plan.length.tolist()
        return [self._kind(b[c + 1] - b[c], offset[b[c]], length[b[c]], full, known,
                           sum(length[b[c]:b[c + 1]]))
                for c, (full, known) in enumerate(zip(plan.chunks.full.tolist(),
                                                      plan.chunks.known.tolist(), strict=True))]

    def _kind(self, count: Any, first_offset: Any, first_length: Any, full: Any, known: Any,
              covered: Any) -> Any:
        """The one place that decides how a chunk's pieces are read (element-wise
        on arrays): ``count`` pieces covering ``covered`` of its ``full`` bytes, the
        first at ``first_offset`` for ``first_length``.  See the module docstring."""
        whole = known & self.options.reads_whole(full, covered)
        direct = (count == 1) & (first_offset == 0) & (first_length == full) \
            & (full >= self.options.stream_above)
        return direct * DIRECT + whole * (1 - direct) * WHOLE

    async def _round(self, plan: ReadPlan, out: list[Any], kinds: list[int],
                     state: Failover, *, last: bool) -> None:
        """Every replica in turn until each piece is read or its chunk has none left."""
        rows: Sequence[int] = range(len(kinds)) if state.untouched else \
            np.unique(plan.chunk[~state.done]).tolist()
        while True:
            groups, patient = state.assign(rows, self.plane.order_replicas, last)
            if not groups:
                return
            requests = [(target, ids, job) for target, chunks in groups.items()
                        for ids, job in self._requests(plan, out, kinds, target, chunks,
                                                       state, patient)]
            # In plan order (a striped read: file order), so that the first
            # requests let through by ``limit`` keep every target busy.
            requests.sort(key=lambda r: int(r[1][0]))
            outcomes = await _all([self._attempt(ids, job) for _, ids, job in requests])
            for (target, _, _), (ids, error) in zip(requests, outcomes, strict=True):
                if error is None:
                    state.read(ids)
                else:
                    state.failed(state.blame(np.unique(plan.chunk[ids]), plan.chunks.name,
                                             error), target, error)
            if not state.left:
                return
            rows = np.unique(plan.chunk[~state.done]).tolist()

    def _requests(self, plan: ReadPlan, out: list[Any], kinds: list[int], target: str,
                  rows: list[int], state: Failover, patient: set[int],
                  ) -> list[tuple[np.ndarray, Job]]:
        """The requests that read chunks ``rows`` (their pieces not yet done) from
        ``target``, each with the pieces it serves."""
        url = plan.chunks.urls.get(target)
        if url is None:
            ids = np.flatnonzero(np.isin(plan.chunk, rows) & ~state.done)
            return [(ids, partial(_fail, unknown_target(target)))]
        jobs: list[tuple[np.ndarray, Job]] = []
        ranged: list[int] = []
        bounds = plan.bounds.tolist()
        first, done = state.untouched, state.done
        for c in rows:
            kind = kinds[c]
            if kind == RANGED:
                ranged.append(c)
                continue
            ids = np.arange(bounds[c], bounds[c + 1])
            if not first:
                ids = ids[~done[ids]]
            jobs.append((ids, partial(self._read_direct, plan, out, target, url, c, int(ids[0]),
                                      c in patient) if kind == DIRECT else
                         partial(self._read_whole, plan, out, target, url, c, ids,
                                 c in patient)))
        if len(ranged) == len(kinds) and first:
            jobs.extend(self._ranged(plan, out, target, url, np.arange(len(plan)), patient))
        elif ranged:
            ids = np.flatnonzero(np.isin(plan.chunk, ranged) & ~done)
            jobs.extend(self._ranged(plan, out, target, url, ids, patient))
        return jobs

    @staticmethod
    async def _attempt(ids: np.ndarray, job: Job) -> Outcome:
        try:
            await job()     # made here: a request cancelled before it starts is never made
        except FAILOVER_ERRORS as exc:
            return ids, exc
        return ids, None

    def _ranged(self, plan: ReadPlan, out: list[Any], target: str, url: str,
                ids: np.ndarray, patient: set[int]) -> list[tuple[np.ndarray, Job]]:
        """Sorted pieces merged per chunk into runs; runs cut into batched requests."""
        chunk, offset, length = plan.chunk[ids], plan.offset[ids], plan.length[ids]
        base = chunk << _SHIFT
        begin, end = base + offset, base + offset + length
        new = np.ones(len(ids), dtype=bool)
        new[1:] = begin[1:] > np.maximum.accumulate(end)[:-1] + self.options.merge_gap
        new[1:] |= chunk[1:] != chunk[:-1]
        first = np.flatnonzero(new)
        lo = offset[first]
        hi = np.maximum.reduceat(end, first) - base[first]
        jobs = []
        for a, b in cut_requests((hi - lo).tolist(), self.options.max_request_bytes):
            p, q = int(first[a]), int(first[b]) if b < len(first) else len(ids)
            rows = chunk[first[a:b]].tolist()
            items = [ReadItem(plan.chunks.name[c], s, e - s) for c, s, e in
                     zip(rows, lo[a:b].tolist(), hi[a:b].tolist(), strict=True)]
            # where each piece lands in the request's buffer
            size = hi[a:b] - lo[a:b]
            shift = np.repeat(np.cumsum(size) - size - lo[a:b], np.diff(first[a:b],
                                                                        append=q))
            jobs.append((ids[p:q], partial(
                self._read_batch, plan, out, target, url, items, ids[p:q], offset[p:q] + shift,
                any(c in patient for c in rows))))
        return jobs

    async def _read_batch(self, plan: ReadPlan, out: list[Any], target: str, url: str,
                          items: list[ReadItem], ids: np.ndarray, at: np.ndarray,
                          patient: bool) -> None:
        """One batched request; piece ``ids[k]`` is at ``at[k]`` of its buffer."""
        view = memoryview(bytearray(sum(i.length for i in items)))
        async with self.limit:
            await self.plane.batch_read_into(target, url, items, view, patient=patient)
        chunks = plan.chunks
        rows, length = plan.chunk[ids], plan.length[ids]
        whole = (plan.offset[ids] == 0) & (length == chunks.full[rows]) & chunks.known[rows]
        for k in np.flatnonzero(whole).tolist():       # a whole small chunk: check it here
            s = int(at[k])
            self._verify(chunks, int(rows[k]), target, view[s:s + int(length[k])])
        _hand_out(plan, out, ids, at, view)

    async def _read_whole(self, plan: ReadPlan, out: list[Any], target: str, url: str,
                          c: int, ids: np.ndarray, patient: bool) -> None:
        """Chunk ``c`` whole into a reused buffer (see :meth:`take`), its pieces copied out."""
        view = memoryview(self.take(int(plan.chunks.full[c])))
        async with self.limit:
            await self.plane.read_chunk_into(target, url, plan.chunks.name[c], 0, view,
                                             whole=True, patient=patient)
        try:
            self._verify(plan.chunks, c, target, view)
            _hand_out(plan, out, ids, plan.offset[ids], view)
        finally:
            self.give_back(view)

    async def _read_direct(self, plan: ReadPlan, out: list[Any], target: str, url: str,
                           c: int, piece: int, patient: bool) -> None:
        """Chunk ``c`` whole, straight into its place in the caller's buffer (a
        piece ``alone``: into a buffer of its own, handed out as bytes)."""
        at, n, d = int(plan.at[piece]), int(plan.length[piece]), int(plan.dest[piece])
        view = memoryview(bytearray(n) if plan.alone[piece] else out[d])[at:at + n]
        async with self.limit:
            stored = await self.plane.read_chunk_into(target, url, plan.chunks.name[c], 0,
                                                      view, whole=True, patient=patient)
        self._verify(plan.chunks, c, target, view, stored)
        if plan.alone[piece]:
            out[d] = bytes(view)

    def _verify(self, chunks: Chunks, c: int, target: str, data: memoryview,
                stored: int | None = None) -> None:
        """Check a whole chunk end to end: against the CRC committed with the file,
        or, when the file has no checksums, the one the target stored at write."""
        name = chunks.name[c]
        expected = chunks.crc[c] if chunks.crc[c] is not None else stored
        if expected is None:
            raise CorruptChunk(f"target {target} sent chunk {name} without a checksum",
                               chunk=name, target=target)
        actual = crc32c(data)
        if actual != expected:
            self.plane.counter(target).errors += 1     # the target sent bad bytes
            raise CorruptChunk(f"chunk {name} from target {target}: CRC32C {actual:08x}, "
                               f"expected {expected:08x}", chunk=name, target=target)

    def take(self, size: int) -> bytearray:
        """A buffer of ``size`` bytes: a spare one, else a new one (a new 4 MiB
        buffer costs as much to zero and fault in as a chunk costs to receive)."""
        spare = self._spare.get(size)
        return spare.pop() if spare else bytearray(size)

    def give_back(self, view: memoryview) -> None:
        """Keep the buffer under ``view`` for the next whole-chunk read (at most
        ``bytes_in_flight`` of them are kept).  Only a read that finished gives
        its buffer back: a cancelled one may still be writing to it."""
        buf = view.obj
        view.release()
        assert isinstance(buf, bytearray)
        kept = sum(size * len(bufs) for size, bufs in self._spare.items())
        if kept + len(buf) <= self.options.bytes_in_flight:
            self._spare.setdefault(len(buf), []).append(buf)


async def _fail(error: StagerError) -> None:
    raise error


async def _all(jobs: list[Awaitable[T]]) -> list[T]:
    """Every job's result; one job runs in this task (a striped read of one chunk
    piece is the common case, and each task costs as much as planning it)."""
    if len(jobs) == 1:
        return [await jobs[0]]
    return await gather_or_cancel(jobs)


def _hand_out(plan: ReadPlan, out: list[Any], ids: np.ndarray, at: np.ndarray,
              view: memoryview) -> None:
    """Copy piece ``ids[k]`` out of ``view[at[k]:]`` to its destination.

    A piece ``alone`` becomes a bytes object of its own via ``tobytes()``: it
    copies straight into the new object, where ``bytes(view[...])`` first goes
    through the buffer protocol (about half the cost for a 1 KiB sample, this
    loop's whole work for the Loader's small samples)."""
    alone = plan.alone[ids]
    length = plan.length[ids]
    if alone.all():         # the Loader's small samples: one bytes object each
        for d, s, n in zip(plan.dest[ids].tolist(), at.tolist(), length.tolist(),
                           strict=True):
            out[d] = view[s:s + n].tobytes()
        return
    for d, s, n, t, one in zip(plan.dest[ids].tolist(), at.tolist(), length.tolist(),
                               plan.at[ids].tolist(), alone.tolist(), strict=True):
        if one:
            out[d] = view[s:s + n].tobytes()
        else:
            out[d][t:t + n] = view[s:s + n]


def cut_requests(sizes: list[int], limit: int) -> list[tuple[int, int]]:
    """Runs of ``sizes`` bytes cut into requests ``[a, b)`` of at most ``limit``
    bytes (a bigger run goes alone) and ``MAX_BATCH_ITEMS`` runs."""
    out: list[tuple[int, int]] = []
    a, size = 0, 0
    for b, n in enumerate(sizes):
        if b > a and (size + n > limit or b - a >= MAX_BATCH_ITEMS):
            out.append((a, b))
            a, size = b, 0
        size += n
    if sizes:
        out.append((a, len(sizes)))
    return out
