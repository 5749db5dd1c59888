"""The one executor of write plans (:mod:`.writeplan`): copies per target, one reroute loop.

The streaming writer (:mod:`.writer`) hands it each chunk as it is cut,
``write_many`` (:mod:`stager.client.bulk`) a batch of files at once.  Each round,
every copy a row's layout wants and no target proved stored (:mod:`.ack`) is
sent, grouped per target, at most ``limit`` requests at once (:meth:`_put`).

A copy that fails in a way to route around (:func:`routes_around`) does not fail
its file when the engine has a ``reroute``: the target is reported for every
upload whose layout names it, each takes a layout with another target in its
slot (the metadata server makes the target suspect for all only when its own
probe fails too: :mod:`stager.meta.reroute`), and the next round sends what the
new layouts place where it is not: from the bytes while held, else read from a
surviving replica and checked against its CRC32C (:mod:`.goodcopy`), so no chunk
is acknowledged on fewer than ``replicas`` copies.  An upload fails alone (its
``error``): a failure not to route around, no other target, ``max_reroutes``
reports, or a stored chunk with no surviving copy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..aio import gather_or_cancel
from ..errors import (
    CorruptChunk,
    InsufficientStorage,
    InternalError,
    NoTargets,
    StagerError,
    StorageError,
    Unavailable,
)
from ..protocol.messages import RerouteItem, Upload
from .engine import cut_requests
from .goodcopy import read_good_copy
from .rawput import RAW_PUT_MAX, put_chunk
from .transport import DataPlane, unknown_target
from .writeplan import Placement, WritePlan

# (target, the failure, the uploads) -> per upload, its new layout and locations or why not
Reroute = Callable[[str, StagerError, Sequence[RerouteItem]],
                   Awaitable[Sequence[Upload | Placement | StagerError]]]
# What a write routes around: the target, not the request, is at fault.
WRITE_FAILOVER = (Unavailable, InsufficientStorage, StorageError, InternalError, CorruptChunk)
CHUNK_BATCH_BYTES = 8 << 20      # bytes of chunks per chunk batch


def routes_around(exc: BaseException) -> bool:
    """Whether a failed chunk write ``exc`` is one to route around."""
    return isinstance(exc, WRITE_FAILOVER) and not isinstance(exc, NoTargets)


def to_route_around(exc: BaseException, url: str | None, reroute: Reroute | None) -> bool:
    """Whether a failed copy to a target at ``url`` (``None``: no address, nothing to
    route around) is routed around, by ``reroute``, rather than failing its upload."""
    return url is not None and reroute is not None and routes_around(exc)


async def put_copy(plane: DataPlane, target: str, url: str | None, chunk: str,
                   data: memoryview, crc: int, options: WriteOptions) -> None:
    """One copy of one chunk to one target: the request of a chunk alone (the raw
    client's PUT when small: :func:`.rawput.put_chunk`)."""
    if url is None:
        raise unknown_target(target)
    await put_chunk(plane, target, url, chunk, data, crc, limit=options.raw_put_bytes)


def only_full(failure: BaseException | str) -> bool:
    """Whether a failed chunk write (its error, or the error's wire code) says only
    that the target is full: a full target is not a dead one.  It still serves the
    chunks it holds, so it is routed around but neither made suspect nor probed."""
    code = failure if isinstance(failure, str) else getattr(failure, "code", None)
    return code == InsufficientStorage.code


def reroute_failed(why: StagerError, cause: StagerError) -> StagerError:
    """The error of a write whose reroute failed (``why``, e.g. too few healthy
    nodes), naming the chunk write failure that asked for it.  Where the target
    answered from its disk (full, EIO), that stays the error's kind: its errno
    (ENOSPC, EIO) is what a caller, the mount's included, must see."""
    if isinstance(why, NoTargets) and isinstance(cause, (InsufficientStorage, StorageError)):
        return type(cause)(f"{cause.message}; no other target: {why.message}", **cause.details)
    return type(why)(f"{why.message} (after: {cause.message})", **why.details)


@dataclass(frozen=True)
class WriteOptions:
    batch_bytes: int = CHUNK_BATCH_BYTES     # several chunks to a target: batches this big
    copy_bytes: int = 32 << 20               # chunks read back at once after a reroute
    max_reroutes: int = 16                   # reports per upload before a failure stands
    raw_put_bytes: int = RAW_PUT_MAX         # a lone chunk this small: the raw client's PUT


class WriteEngine:
    """Stores the rows of one plan, at most ``limit`` requests (each of at most
    ``batch_bytes``, or one chunk) out at once; :meth:`store` may run concurrently
    (the streaming writer calls it once per chunk)."""

    def __init__(self, plane: DataPlane, plan: WritePlan, limit: asyncio.Semaphore, *,
                 reroute: Reroute | None = None, options: WriteOptions | None = None) -> None:
        self.plane, self.plan, self.limit, self.reroute = plane, plan, limit, reroute
        self.options = options or WriteOptions()
        self.failed: set[str] = set()        # targets that failed (a full one has not)
        self._rerouting = asyncio.Lock()

    async def store(self, rows: np.ndarray, *,
                    broken: dict[str, StagerError] | None = None) -> None:
        """Store ``rows`` (held by this call) on every target their layout names,
        until each is stored or its upload failed; then let go of their bytes.
        ``broken``: targets a copy of them already failed on, to route around (as
        :meth:`_send` reports them) before anything is sent."""
        plan = self.plan
        try:
            await self._fetch(rows)
            while True:
                for target, exc in (broken or {}).items():
                    stale = await self._route_around(target, exc)
                    for a, b in cut_requests(plan.length[stale].tolist(),
                                             self.options.copy_bytes):
                        await self.store(stale[a:b])
                if not len((missing := plan.missing(rows))[0]):
                    break
                broken = await self._send(*missing)
            # no await since the check: a reroute sees these rows stored
        finally:
            plan.busy[rows] = False
            for r in rows.tolist():
                plan.data[r] = None

    async def _send(self, rows: np.ndarray, targets: np.ndarray) -> dict[str, StagerError]:
        """Copy ``rows[k]`` to target ``targets[k]`` (sorted by target) for each k, in
        requests per target; the targets to route around, each with its error."""
        broken: dict[str, StagerError] = {}
        if len(targets) == 1:       # one copy of one chunk (a small file's): one PUT
            await self._put(int(targets[0]), rows, broken)
            return broken
        starts = np.flatnonzero(targets[1:] != targets[:-1]) + 1   # sorted: where each begins
        jobs = [self._put(t, part[a:b], broken)
                for t, part in zip(targets[np.r_[0, starts]].tolist(), np.split(rows, starts),
                                   strict=True)
                for a, b in cut_requests(self.plan.length[part].tolist(),
                                         self.options.batch_bytes)]
        await (jobs[0] if len(jobs) == 1 else gather_or_cancel(jobs))
        return broken

    async def _put(self, t: int, rows: np.ndarray, broken: dict[str, StagerError]) -> None:
        """One request to target number ``t``, decided here and nowhere else: a PUT of
        one chunk, a chunk batch of several.  A failure is routed around (into
        ``broken``) or fails the uploads of ``rows``."""
        plan = self.plan
        target, files = plan.targets[t], sorted(set(plan.file[rows].tolist()))
        url = plan.uploads[files[0]].locations.get(target)
        items = [(plan.name(r), plan.data[r], c)
                 for r, c in zip(rows.tolist(), plan.crc[rows].tolist(), strict=True)]
        try:
            async with self.limit:
                if len(items) == 1 or url is None:      # no address: put_copy refuses
                    await put_copy(self.plane, target, url, *items[0],  # type: ignore[arg-type]
                                   options=self.options)
                else:
                    await self.plane.put_chunks(target, url, items)     # type: ignore[arg-type]
        except StagerError as exc:
            if to_route_around(exc, url, self.reroute):
                broken.setdefault(target, exc)
            else:
                for f in files:
                    plan.fail(f, exc)
        else:
            plan.placed[rows, t] = True

    async def _route_around(self, target: str, exc: StagerError) -> np.ndarray:
        """Report ``target`` for the uploads whose layout still names it (one report
        at a time) and take their new layouts; returns the rows stored before to
        copy again (held by the caller)."""
        assert self.reroute is not None
        plan = self.plan
        stale = [np.zeros(0, dtype=np.int64)]
        async with self._rerouting:
            if not only_full(exc):
                self.failed.add(target)     # a full target still serves what it holds
            affected: list[int] = []
            for f, up in enumerate(plan.uploads):
                if up.error is None and target in up.layout.targets:
                    if len(up.rerouted) < self.options.max_reroutes:
                        affected.append(f)
                    else:
                        plan.fail(f, exc)
            if not affected:
                return stale[0]
            begun = np.bincount(plan.file[:plan.n], minlength=len(plan.uploads))
            try:
                answers = await self.reroute(target, exc, [RerouteItem(
                    plan.uploads[f].file_id, int(begun[f])) for f in affected])
            except StagerError as why:
                answers = [why] * len(affected)
            for f, got in zip(affected, answers, strict=True):
                if isinstance(got, StagerError):
                    plan.fail(f, reroute_failed(got, exc))
                elif target in got.layout.targets:
                    plan.fail(f, exc)       # nothing to replace it with: the failure stands
                else:
                    stale.append(plan.reroute(f, target, got.layout, got.locations))
        return np.concatenate(stale)

    async def _fetch(self, rows: np.ndarray) -> None:
        """The bytes of the rows let go of, each read from a surviving replica."""
        plan = self.plan

        async def fetch(r: int) -> None:
            f = int(plan.file[r])
            locations = plan.uploads[f].locations
            held = [plan.targets[t] for t in np.flatnonzero(plan.placed[r]).tolist()]
            sources = [(t, locations[t]) for t in sorted(held)
                       if t not in self.failed and t in locations]
            buf = memoryview(bytearray(int(plan.length[r])))
            try:
                async with self.limit:
                    await read_good_copy(self.plane, plan.name(r), sources, buf,
                                         int(plan.crc[r]))
                plan.data[r] = buf
            except StagerError as exc:
                plan.fail(f, exc)

        let_go = [r for r in rows.tolist() if plan.data[r] is None]
        if let_go:              # rows stored before a reroute, to copy again
            await asyncio.gather(*(fetch(r) for r in let_go))
