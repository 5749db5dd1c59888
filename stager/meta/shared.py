"""Several metadata servers on one store: each reads back what the others wrote.

With a store only one server uses (SQLite) nothing here runs.  On a shared store
(PostgreSQL) every server, every ``heartbeat_interval / 2``:

* reads the targets as stored (each heartbeat is written through, whichever
  server it reached, so every server judges liveness from the same
  ``last_heartbeat``), their boot ids, the suspects and the targets being
  retired; a suspicion counts only for the incarnation it was made of, the one
  registered now (:mod:`.suspicion`), whichever server took the registration;
* asks the store whether it holds the background duties (garbage collection,
  rebuild, fsck: :meth:`~.store.servers.SharedState.hold_duties`, an advisory lock of
  PostgreSQL's) and sets :attr:`MetaService.duties_held`;
* reads the status sections the duty holder stored (rebuild progress, last fsck).

A stat of a file on a target this server has not read yet (registered with another
server since its last read) reads the shared state back at once, before it answers:
the file's locations name every target, as the other server's would.

A revoke through one server reaches the others through the token table
(:mod:`.authapp` refreshes its revoked set the same way, more often).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Collection
from dataclasses import replace

from aiohttp import web

from ..aio import cancel_and_wait, keep_doing
from ..config import Config
from .service import GONE_STATES, MetaService
from .suspicion import Suspicion, merged

log = logging.getLogger("stager.meta")
MISSING_FOR = 5.0       # seconds a target unknown after a read asks no other read


async def sync(service: MetaService) -> None:
    """Bring ``service``'s soft state to what the store holds (a shared store only)."""
    store = service.store
    service.duties_held = await store.hold_duties()
    read_at = service.clock()
    stored = await store.list_targets()
    boots = {_id(key): str(body.get("boot", "")) for key, body in
             (await store.get_states("boot/")).items()}
    suspects = {_id(key): Suspicion.from_json(body)
                for key, body in (await store.get_states("suspect/")).items()}
    retiring = await store.get_states("retiring/")
    statuses = await store.get_states("status/")
    left = {_id(key): float(body.get("at", 0.0))
            for key, body in (await store.get_states("left/")).items()}
    now = service.clock()
    service.retiring = {_id(key) for key in retiring}
    # `stager target forget` on another server: gone from the store.  Not a target that
    # registered here after the list was read (it is in the store now, not in the list).
    for forgotten in set(service.targets) - {t.id for t in stored}:
        if service.targets[forgotten].last_heartbeat < read_at:
            del service.targets[forgotten]
    for t in stored:
        old = service.targets.get(t.id)
        boot = boots.get(t.id) or (old.boot if old is not None else "")
        suspicion = merged([service.suspects.get(t.id), suspects.get(t.id)], boot)
        if suspicion is not None and suspicion.until > now:
            service.suspects[t.id] = suspicion
        else:
            service.suspects.pop(t.id, None)
        last = max(t.last_heartbeat, old.last_heartbeat if old is not None else 0.0)
        state = t.state         # lost and removed are stored facts; the rest is judged
        if state not in GONE_STATES:
            if now - last > service.config.target_timeout or left.get(t.id, -1.0) >= last:
                state = "down"          # silent, or it said it was leaving and is silent
            else:
                state = "suspect" if suspicion is not None and suspicion.until > now else "up"
        service.targets[t.id] = replace(t, state=state, last_heartbeat=last, boot=boot)
    service.refresh_health()
    service.shared_status = {_id(key): body for key, body in statuses.items()}


def _id(key: str) -> str:
    """The name after a state key's prefix: ``suspect/t1`` → ``t1``."""
    return key.split("/", 1)[1]


def install(app: web.Application, service: MetaService, config: Config) -> None:
    """Keep ``service`` in step with the other servers on its store, while ``app`` runs
    (after the service has started: add it after the context that starts it)."""
    if not service.store.shared:
        return
    interval = max(0.1, config.heartbeat_interval / 2)
    service.status_extras.append(lambda: {"duties": {"held": service.duties_held}})

    async def loop() -> None:
        await keep_doing(lambda: sync(service), interval, "reading the shared state back",
                         log)

    reading: list[asyncio.Future[None]] = []
    missing: dict[str, float] = {}      # still unknown after a read: until when, no more

    async def read_back(ids: Collection[str]) -> None:
        """One read of the shared state now, for targets ``ids`` unknown here: shared by
        the stats that ask while it runs.  A target still unknown after it (forgotten
        meanwhile, its files not yet moved) asks no read for MISSING_FOR seconds."""
        now = time.monotonic()
        if all(missing.get(t, 0.0) > now for t in ids):
            return
        if not reading or reading[0].done():
            reading[:] = [asyncio.ensure_future(sync(service))]
        await asyncio.shield(reading[0])
        now = time.monotonic()
        for t in [t for t, until in missing.items() if until <= now]:
            del missing[t]
        missing.update((t, now + MISSING_FOR) for t in ids if t not in service.targets)

    service.read_back = read_back

    async def running(app: web.Application) -> AsyncIterator[None]:
        await sync(service)
        task = asyncio.create_task(loop())
        yield
        await cancel_and_wait([task])

    app.cleanup_ctx.append(running)
