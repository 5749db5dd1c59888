"""Garbage collection: the chunks of deleted, replaced and abandoned files purged from
their targets, by the metadata server holding the background duties (its loop is in
stager/meta/http/app.py)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from ...errors import NotFound, StagerError
from ...protocol.batch import MAX_BATCH_ITEMS
from ...protocol.models import TargetInfo
from ...web.idempotency import KEY_TTL
from ..service import GONE_STATES, MetaService

log = logging.getLogger("stager.meta")
Purger = Callable[[TargetInfo, list[str]], Awaitable[int]]


async def collect_garbage(service: MetaService, purge: Purger, *, limit: int = 256) -> int:
    """Purge chunks of deleted, replaced and abandoned files; returns files finished."""
    expired = await service.store.expired_uploads(service.clock() - service.config.upload_grace)
    for upload in expired:
        log.info("upload %s of %s abandoned: collecting", upload.file_id, upload.path)
    for start in range(0, len(expired), MAX_BATCH_ITEMS):
        await service.abort([u.file_id for u in expired[start:start + MAX_BATCH_ITEMS]])
    garbage = await service.store.take_garbage(limit)
    if not garbage:
        return 0
    by_target: dict[str, list[str]] = {}
    for g in garbage:
        for t in set(g.layout.targets):
            by_target.setdefault(t, []).append(g.file_id)
    failed: set[str] = set()
    for target_id, file_ids in by_target.items():
        target = service.targets.get(target_id)
        if target is not None and target.state in GONE_STATES:
            continue    # its chunks are gone; any that come back are orphans (fsck)
        try:
            if target is None or not target.up:
                raise NotFound(f"target {target_id} is not up")
            await purge(target, file_ids)
        except (StagerError, OSError) as exc:
            log.debug("purge on %s deferred: %s", target_id, exc)
            failed.update(file_ids)
    done = [g.file_id for g in garbage if g.file_id not in failed]
    if done:
        now = service.clock()      # purged ids stay retired as long as answers are kept
        await service.store.drop_garbage(done, now=now, forget_before=now - KEY_TTL)
    return len(done)
