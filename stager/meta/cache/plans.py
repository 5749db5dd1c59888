"""Registered Loader plans: what eviction looks ahead at, and what fills run ahead of.

A Loader reading cached files registers its plan (route ``register_plan``): the
parameters of its order and partition and its dataset's sample extents, not the
list of reads.  From them :func:`stager.plans.registered.plan_uses` derives, with
the Loader's own functions, when each cached chunk is read next; the job's
positions (route ``plan_position``, sent by each rank's Loader as it goes) say where
"now" is: at the slowest rank.  Registrations live in the store's shared reports (every metadata
server sees them; the duty holder evicts by them) and expire with their ``ttl``
unless registered again: a job that died stops steering eviction.

Two uses:

- :meth:`PlanBook.next_use`: for plan-aware eviction (``cache_policy = plan``), the
  steps until any live plan reads a chunk (never: ``inf``), soonest across jobs;
- :meth:`PlanBook.ahead`: the chunks the plans read in the next few steps, which the
  duty holder fills before the ranks ask (a first epoch over an attached dataset is
  then fed at the source's rate rather than a round trip behind it).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import BadRequest, Forbidden, NotFound
from ...eviction import NextUse
from ...plans.registered import ChunkKey, Dataset, Plan, PlanUses, plan_uses, soonest
from ...protocol.cache import (
    MAX_FILLED_ANSWERED,
    MAX_PLAN_TTL,
    PlanPosition,
    PlanRegistered,
    PlanRequest,
)

if TYPE_CHECKING:
    from ..service import MetaService

PREFIX, AT = "plan:", "plan-at:"         # shared report keys: the plan, a rank's position
KEPT = 16                                # derived tables kept in memory
_UNKNOWN = object()
MAX_EXTENTS = 4_000_000                  # extents one registration may name
SCANNED = 1 << 21                        # filled chunks looked through for a registration


def dataset_of(obj: dict[str, Any]) -> Dataset:
    """The dataset of a registration body (BadRequest naming what is wrong)."""
    try:
        files = tuple(obj["files"])
        sizes = tuple(int(c) for c in obj["chunk_sizes"])
        arrays = [np.asarray(obj[k], dtype=np.int64)
                  for k in ("sample", "file", "offset", "length")]
        samples = int(obj["samples"])
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise BadRequest(f"a plan's dataset needs files, chunk_sizes, samples and the "
                         f"sample, file, offset and length of each extent: {exc}") from None
    if not all(isinstance(f, str) for f in files) or samples < 0:
        raise BadRequest("a plan's dataset: files are file ids, samples a count")
    if len(arrays[0]) > MAX_EXTENTS:
        raise BadRequest(f"a plan's dataset may name at most {MAX_EXTENTS} extents")
    return Dataset(files, sizes, samples, *arrays)


class PlanBook:
    def __init__(self, service: MetaService) -> None:
        self.service = service
        self.store = service.store
        self._derived: dict[str, tuple[str, Plan, Dataset, PlanUses]] = {}
        # each plan's registrant and ttl as this server last read them (a position
        # report checks against them without reading every registration back)
        self._owners: dict[str, str | None] = {}
        self._ttls: dict[str, float] = {}

    async def register(self, plan_id: str, request: PlanRequest, *, owner: str | None,
                       may_read: Callable[[str], bool]) -> PlanRegistered:
        """Record the plan (BadRequest for a plan or dataset that does not parse;
        Forbidden when the token may not read a cached file it names)."""
        dataset = dataset_of(request.dataset)
        Plan.from_dict(request.plan, dataset.samples)       # checked before it is kept
        cached = await self.store.find_cached(list(set(dataset.files)))
        for f in cached.values():
            if not may_read(f.path):
                raise Forbidden(f"this token may not read {f.path}", path=f.path)
        old = (await self._live()).get(plan_id)
        if old is not None and old[0].get("owner") != owner:
            raise Forbidden(f"plan {plan_id} is another token's", plan_id=plan_id)
        expires = self.service.clock() + request.ttl
        # the registration's digest, made once: each eviction and prefetch round tells
        # a plan it has derived already by it, not by hashing the dataset again
        digest = hashlib.sha256(json.dumps([request.plan, request.dataset],
                                           sort_keys=True).encode()).hexdigest()
        body = {"plan": request.plan, "dataset": request.dataset, "owner": owner,
                "digest": digest,
                "ttl": request.ttl}
        # the registration is kept a long while; it is live while a rank's position is
        # (each expires ``ttl`` after its report), so a position report, 100 a second
        # per job, never writes the registration's dataset again
        await self.store.put_report(PREFIX + plan_id, body,
                                    expires=self.service.clock() + MAX_PLAN_TTL)
        await self.store.put_report(f"{AT}{plan_id}:0", request.position.to_json(),
                                    expires=expires)
        self._owners[plan_id], self._ttls[plan_id] = owner, request.ttl
        return PlanRegistered(plan_id, len(cached), expires, await self.filled(set(cached)))

    async def filled(self, file_ids: set[str]) -> dict[str, dict[int, int]]:
        """The CRC32Cs of the filled chunks of ``file_ids`` (at most
        ``MAX_FILLED_ANSWERED``): a rank's client learns them, so that a fresh
        Loader's reads of chunks cached already skip the fill round trip, as a staged
        file's reads do.  The filled chunks are read a page at a time (``SCANNED`` at
        most: the cache's rows, bounded by its size, not one query per file)."""
        out: dict[str, dict[int, int]] = {}
        after, found, scanned = ("", -1), 0, 0
        while file_ids and found < MAX_FILLED_ANSWERED and scanned < SCANNED:
            page = await self.store.cache_chunks(after=after)
            if not page:
                break
            scanned += len(page)
            for chunk in page:
                if chunk.file_id in file_ids and found < MAX_FILLED_ANSWERED:
                    out.setdefault(chunk.file_id, {})[chunk.index] = chunk.crc
                    found += 1
            after = (page[-1].file_id, page[-1].index)
        return out

    async def position(self, plan_id: str, at: PlanPosition, *, owner: str | None,
                       rank: int = 0) -> PlanPosition:
        """Where rank ``rank`` of the plan's job reads now (the slowest rank is the
        plan's now: a chunk a lagging rank has yet to read is not in its past).  The
        answer: the position, and where it asks to ``learn``, the CRC32Cs of the
        plan's chunks filled now (the registrant's token read every file it names)."""
        known = self._owners.get(plan_id, _UNKNOWN)
        ttl = self._ttls.get(plan_id)
        if known is _UNKNOWN or ttl is None or known != owner:   # as stored now
            live = (await self._live()).get(plan_id)
            if live is None:
                raise NotFound(f"no plan {plan_id} is registered (or it expired)",
                               plan_id=plan_id)
            known, ttl = live[0].get("owner"), float(live[0]["ttl"])
            self._owners[plan_id], self._ttls[plan_id] = known, ttl
        if known != owner:
            raise Forbidden(f"plan {plan_id} is another token's", plan_id=plan_id)
        await self.store.put_report(f"{AT}{plan_id}:{rank}", at.to_json(),
                                    expires=self.service.clock() + ttl)
        if not at.learn:
            return at
        live = (await self._live()).get(plan_id)
        files = set(live[0]["dataset"].get("files", ())) if live is not None else set()
        return PlanPosition(at.epoch, at.cursor, at.rank, filled=await self.filled(files))

    async def _live(self) -> dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]:
        """Each live plan's registration and its ranks' positions."""
        reports = await self.store.live_reports(self.service.clock())
        out: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {
            key[len(PREFIX):]: (body, []) for key, body in reports.items()
            if key.startswith(PREFIX)}
        for key, at in reports.items():
            if key.startswith(AT):
                plan_id = key[len(AT):].rsplit(":", 1)[0]
                if plan_id in out:
                    out[plan_id][1].append(at)
        # a registration none of whose ranks has reported within its ttl is a job gone
        return {plan_id: live for plan_id, live in out.items() if live[1]}

    async def current(self) -> list[tuple[PlanUses, int, Plan, Dataset]]:
        """Each live plan's next-use table and the step its job is at."""
        out = []
        live = await self._live()
        for plan_id, (body, at) in sorted(live.items()):
            digest = body["digest"]
            kept = self._derived.get(plan_id)
            if kept is None or kept[0] != digest:
                dataset = dataset_of(body["dataset"])
                plan = Plan.from_dict(body["plan"], dataset.samples)
                kept = self._derived[plan_id] = (digest, plan, dataset,
                                                 plan_uses(plan, dataset))
                while len(self._derived) > KEPT:
                    self._derived.pop(next(iter(self._derived)))
            _, plan, dataset, uses = kept
            where = at or [{"epoch": plan.epoch, "cursor": plan.cursor}]
            step = min(plan.step_at(dataset.samples, int(w["epoch"]), int(w["cursor"]))
                       for w in where)
            out.append((uses, step, plan, dataset))
        return out

    async def next_use(self) -> NextUse | None:
        """Steps until a live plan reads a chunk, soonest across jobs; ``None`` when no
        plan is registered (the policy falls back to LRU)."""
        plans = [(uses, step) for uses, step, _, _ in await self.current()]
        if not plans:
            return None
        return lambda key, _now: soonest(plans, key)

    async def ahead(self, steps: int) -> list[ChunkKey]:
        """The chunks the live plans read in their next ``steps`` steps, soonest first
        (each once)."""
        found: dict[ChunkKey, float] = {}
        for uses, step, _, dataset in await self.current():
            a = uses.accesses
            window = (a.step >= step) & (a.step < step + steps)
            for key, when in zip(a.key[window].tolist(), a.step[window].tolist(), strict=True):
                name = dataset.name(key)
                found[name] = min(found.get(name, math.inf), when - step)
        return sorted(found, key=lambda k: (found[k], k))

