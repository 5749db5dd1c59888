"""The client's calls on attached directories (:mod:`stager.protocol.cache`).

:class:`CacheCalls` is mixed into :class:`~stager.client.async_client.AsyncClient`:
``attach``, ``refresh``, ``detach``, ``attachments``, and ``fill``, which the read
engine calls (through the data plane's ``filler``) before it reads chunks of a
cached file whose CRC32Cs it has not learnt, and ``count_reads``, which reports
the reads it made without asking (through the data plane's ``learnt``).  A Loader's
plan registration (``register_plan``) answers the CRC32Cs of its dataset's chunks
filled already, which the data plane learns: a fresh Loader's reads of a cached
dataset skip the fill round trip as a staged one's skip any.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import StagerError
from ..protocol.batch import MAX_BATCH_ITEMS, batch_body, read_results
from ..protocol.cache import (
    Attachment,
    AttachmentList,
    AttachRequest,
    Detached,
    Filled,
    FillItem,
    PlanPosition,
    PlanRegistered,
    PlanRequest,
    ReadsCounted,
    Refreshed,
)
from ..protocol.models import chunk_id
from ..protocol.routes import route

if TYPE_CHECKING:
    from ..dataplane import DataPlane
    from .metaconn import MetaConnection


class CacheCalls:
    meta: MetaConnection
    plane: DataPlane
    # the plans whose filled CRC32Cs this client asked for with a position report (a
    # class-wide empty default, replaced by the client's own set at its first add)
    _plans_learnt: frozenset[str] | set[str] = frozenset()

    async def attach(self, src: str, dst: str, *, refresh: float | None = None,
                     include: Sequence[str] = (), exclude: Sequence[str] = (),
                     options: Mapping[str, Any] | None = None) -> Refreshed:
        """Make directory ``dst`` a view of the fsspec URL ``src`` (admin): listed now,
        each file's chunks fetched on first read; ``options``: the source's storage
        options, kept by the metadata server (encrypted), never sent back."""
        body = AttachRequest(src, refresh, tuple(include), tuple(exclude),
                             dict(options or {})).to_json()
        self.meta.forget(dst)
        return Refreshed.from_json(await self.meta.request(route("attach"), path=dst,
                                                           body=body))

    async def refresh(self, dst: str) -> Refreshed:
        """List ``dst``'s source again: changed files read their new bytes from now on."""
        answer = await self.meta.request(route("refresh_attachment"), path=dst, body={})
        self.meta.forget(dst)       # a changed file has a new id: stat it again
        return Refreshed.from_json(answer)

    async def detach(self, dst: str) -> Detached:
        """Forget the view ``dst`` and free its cached bytes (admin)."""
        answer = await self.meta.request(route("detach"), path=dst)
        self.meta.forget(dst)
        return Detached.from_json(answer)

    async def attachments(self) -> list[Attachment]:
        return list(AttachmentList.from_json(
            await self.meta.request(route("list_attachments"))).attachments)

    async def fill(self, items: Sequence[FillItem], *, warm: bool = False
                   ) -> list[Filled | StagerError]:
        """Each item's chunks filled (fetched from the source where missing): their
        CRC32Cs, or the item's error.  ``warm``: ahead of a job, not a read (counted
        neither as hits nor as misses)."""
        out: list[Filled | StagerError] = []
        for start in range(0, len(items), MAX_BATCH_ITEMS):
            body = batch_body([i.to_json() for i in items[start:start + MAX_BATCH_ITEMS]])
            if warm:
                body["warm"] = True
            answer = await self.meta.request(route("fill"), body=body)
            out += read_results(answer, Filled.from_json)
        return out

    async def count_reads(self, items: Sequence[FillItem]) -> ReadsCounted:
        """Report reads of filled chunks made with CRC32Cs learnt earlier (the data
        plane's :class:`~stager.dataplane.learnt.CrcMemory` sends these in bulk):
        counted as hits, their chunks marked used for eviction."""
        return ReadsCounted.from_json(await self.meta.request(
            route("cache_reads"), body=batch_body([i.to_json() for i in items])))

    async def register_plan(self, plan_id: str, request: PlanRequest) -> PlanRegistered:
        """Register a Loader's epoch plan over cached files (see
        :mod:`stager.meta.cache.plans`): eviction then keeps what it reads soonest."""
        done = PlanRegistered.from_json(await self.meta.request(
            route("register_plan"), plan_id=plan_id, body=request.to_json()))
        self._plans_learnt = {*self._plans_learnt, plan_id}
        self.learn_filled(done.filled)
        return done

    def learn_filled(self, filled: Mapping[str, Mapping[int, int]]) -> None:
        """Keep the CRC32Cs of chunks filled already (a plan registration answers its
        dataset's): the read engine then reads them straight from the data servers, as
        a staged file's, instead of asking the metadata server first."""
        learnt = self.plane.learnt
        if learnt is None or not filled:
            return
        names = [chunk_id(f, i) for f, crcs in filled.items() for i in crcs]
        learnt.learn(names, [c for crcs in filled.values() for c in crcs.values()])

    async def plan_position(self, plan_id: str, epoch: int, cursor: int, rank: int = 0
                            ) -> None:
        """Where rank ``rank`` of the job of a registered plan reads now.  The first
        report of a plan from this client (until one is answered) also asks for the
        CRC32Cs of the plan's chunks filled already, which it learns: a rank other than
        0 (which registers, and learns by that) then skips the fill round trip too."""
        learn = plan_id not in self._plans_learnt
        answer = PlanPosition.from_json(await self.meta.request(
            route("plan_position"), plan_id=plan_id,
            body=PlanPosition(epoch, cursor, rank, learn).to_json()))
        if learn:
            self._plans_learnt = {*self._plans_learnt, plan_id}
            self.learn_filled(answer.filled)
