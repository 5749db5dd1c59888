"""Writes that route around a failed target (route ``reroute``).

A writer whose chunk write to a target failed (refused, reset, timed out, 5xx,
507) reports it here with each affected upload.  The target becomes *suspect*
at once: no new layout names it for ``target_timeout`` seconds, before any
heartbeat timeout would have noticed (:meth:`MetaService.suspect`); a target
that was only full (507) stays eligible, as space frees up.  Each upload then
gets a replacement for the reported target and for every slot whose target is not up, chosen by
the rebuild's own policy (:func:`.replan.fewest_copies`: the most replicas, then
the fewest chunks to move), and the new layout is stored compare-and-swap on
the one the writer holds, so a commit always records the layout that was
written.  The writer then copies the chunks it has already stored to where the
new layout wants them and goes on (:mod:`stager.dataplane.writer`).

No chunk may be acknowledged on fewer than ``replicas`` copies, so a new layout
must give every stripe slot's chunks their full count on distinct nodes; when
the healthy nodes cannot, the item fails with :class:`NoTargets` naming how many
nodes are needed and up, and the writer aborts (nothing becomes visible).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InsufficientStorage, NoTargets, StagerError
from ..protocol.messages import RerouteItem, RerouteRequest
from ..protocol.models import Layout, TargetInfo
from .replan import fewest_copies, replica_floor
from .store import NodeEntry, Upload

if TYPE_CHECKING:
    from .batch import Created
    from .service import MetaService


async def reroute_many(service: MetaService, request: RerouteRequest
                       ) -> list[Created | StagerError]:
    """Suspect ``request.target`` (unless it was only full); per item, the upload with
    a layout that does not name it, or why not."""
    if request.code != InsufficientStorage.code:
        service.suspect(request.target, request.reason or "a chunk write failed")
        await service.share_suspect(request.target)
    healthy = [t for t in service.healthy_targets() if t.id != request.target]
    out: list[Created | StagerError] = []
    for item in request.items:
        try:
            out.append(await _reroute(service, item, healthy))
        except StagerError as exc:
            out.append(exc)
    return out


async def _reroute(service: MetaService, item: RerouteItem,
                   healthy: list[TargetInfo]) -> Created:
    upload = await service.store.get_upload(item.file_id)     # UploadNotFound when gone
    new = replacement(upload.layout, item.chunks, healthy)
    if new != upload.layout and not await service.store.replace_upload_layout(
            upload.file_id, upload.layout, new):
        # Another report for this upload swapped it first: the writer takes that one
        # (and reports again if it names a target that fails).
        upload = await service.store.get_upload(item.file_id)
        new = upload.layout
    placed = Upload(upload.file_id, upload.path, new, upload.overwrite, upload.parents,
                    upload.created)
    return placed, service.info(NodeEntry(upload.path, "file", 0, upload.created,
                                          upload.file_id, new))


def replacement(layout: Layout, chunks: int, healthy: list[TargetInfo]) -> Layout:
    """``layout`` with every slot of a target that is not healthy filled from
    ``healthy``; the layout itself when all its targets are healthy."""
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

