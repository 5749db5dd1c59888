"""Writes that route around a failed target (route ``reroute``).

A writer whose chunk write to a target failed (refused, reset, timed out, 5xx,
507) reports it here with each affected upload.  Each upload gets at once a
replacement for the reported target and for every slot whose target is not up,
chosen by the rebuild's own policy (:func:`.replan.fewest_copies`: the most
replicas, then the fewest chunks to move), and the new layout is stored
compare-and-swap on the one the writer holds, so a commit always records the
layout that was written.  The writer then copies the chunks it has already
stored to where the new layout wants them and goes on
(:mod:`stager.dataplane.writer`).

The report is one writer's view: the target turns *suspect* for everyone only
when the metadata server's own probe of it fails too, and a target that was only
full (507) is not probed at all (:mod:`.suspicion`).  A report with no upload in
it changes nothing.

No chunk may be acknowledged on fewer than ``replicas`` copies, so a new layout
must give every stripe slot's chunks their full count on distinct nodes.  The up
targets come first, suspect ones where those cannot; never the reported target
(it failed this writer, whatever it answers the probe).  When the others cannot,
the item fails with :class:`NoTargets` naming how many nodes are needed and up,
and the writer aborts (nothing becomes visible).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..dataplane.writeengine import only_full
from ..errors import NoTargets, StagerError
from ..protocol.batch import one
from ..protocol.messages import RerouteItem, RerouteRequest
from ..protocol.models import Layout, TargetInfo
from .store.base import NodeEntry, Upload
from .upkeep.replan import fewest_copies, replica_floor

if TYPE_CHECKING:
    from .service import MetaService
    from .writes import Created


async def reroute_many(service: MetaService, request: RerouteRequest
                       ) -> list[Created | StagerError]:
    """Per item, the upload with a layout that does not name ``request.target``, or
    why not; meanwhile the target is probed (unless it was only full)."""
    if not request.items:
        return []
    probe: asyncio.Future[bool] | None = None
    if not only_full(request.code):
        probe = asyncio.ensure_future(service.check_report(request.target))
    try:
        placeable = service.placeable_targets()
        up = [t for t in placeable if t.up and t.id != request.target]
        spare = [t for t in placeable if not t.up and t.id != request.target]
        out = [await _try(service, item, up, spare) for item in request.items]
        if probe is not None:       # answered once the target's state is settled
            await probe
    finally:
        if probe is not None and not probe.done():
            probe.cancel()          # the probe itself goes on (shared: .suspicion.Probes)
    return out


async def _try(service: MetaService, item: RerouteItem, up: list[TargetInfo],
               spare: list[TargetInfo]) -> Created | StagerError:
    try:
        return await _reroute(service, item, up, spare)
    except StagerError as exc:
        return exc


async def _reroute(service: MetaService, item: RerouteItem, up: list[TargetInfo],
                   spare: list[TargetInfo]) -> Created:
    upload = one(await service.store.get_uploads([item.file_id]))   # UploadNotFound: gone
    new = replacement(upload.layout, item.chunks, up, spare)
    if new != upload.layout and not await service.store.replace_upload_layout(
            upload.file_id, upload.layout, new):
        # Another report for this upload swapped it first: the writer takes that one
        # (and reports again if it names a target that fails).
        upload = one(await service.store.get_uploads([item.file_id]))
        new = upload.layout
    placed = Upload(upload.file_id, upload.path, new, upload.overwrite, upload.parents,
                    upload.created)
    return placed, service.info(NodeEntry(upload.path, "file", 0, upload.created,
                                          upload.file_id, new))


def replacement(layout: Layout, chunks: int, healthy: Sequence[TargetInfo],
                spare: Sequence[TargetInfo] = ()) -> Layout:
    """``layout`` with every slot of a target that is not in ``healthy`` filled from
    ``healthy``; where they cannot keep every chunk's replicas, from ``healthy`` and
    ``spare`` (suspect targets: avoided, never a reason to fail).  The layout itself
    when all its targets are healthy."""
    try:
        return _filled(layout, chunks, healthy)
    except NoTargets:
        if not spare:
            raise
        return _filled(layout, chunks, [*healthy, *spare])


def _filled(layout: Layout, chunks: int, healthy: Sequence[TargetInfo]) -> Layout:
    up = {t.id for t in healthy}
    gone = {t for t in layout.targets if t not in up}
    if not gone:
        return layout
    # Every slot's chunks still to come count, not only the ``chunks`` begun.
    size = max(chunks, layout.stripe_count) * layout.chunk_size
    new = fewest_copies(layout, size, gone, healthy)
    if new is None or replica_floor(new, size) < layout.replicas:
        nodes = len({t.node for t in healthy})
        need = layout.replicas
        raise NoTargets(f"not enough healthy targets: need {need} node{'s' * (need != 1)}, "
                        f"{nodes} up", replicas=need, nodes=nodes)
    return new
