"""The metadata server's own gauges on ``GET /metrics``, refreshed when scraped.

What the Grafana board (deploy/grafana/stager.json) draws from the metadata
server: targets up and down, the cluster's capacity, each target's throughput
over the last minute and its scrub's bytes remaining (from heartbeats:
:mod:`stager.meta.targetstats`), the rebuild's bytes remaining.  The data servers
export their own bytes and usage.
"""

from __future__ import annotations

from typing import Any

from ...web.metrics import ServerMetrics
from ..service import MetaService
from ..targetstats import TargetRates


def refresh(metrics: ServerMetrics, service: MetaService, rates: TargetRates,
            rebuild: dict[str, Any]) -> None:
    """Set every gauge from ``service``, ``rates`` and the rebuild's progress."""
    targets = service.list_targets()
    metrics.gauge("stager_targets_up", "storage targets answering heartbeats").set(
        sum(t.up for t in targets))
    metrics.gauge("stager_targets_down", "storage targets marked down").set(
        sum(not t.up for t in targets))
    metrics.gauge("stager_cluster_capacity_bytes", "bytes the targets offer").set(
        sum(t.capacity for t in targets))
    metrics.gauge("stager_cluster_used_bytes", "bytes of chunks the targets store").set(
        sum(t.used for t in targets))
    read = metrics.gauge("stager_target_read_bytes_per_second",
                         "chunk bytes a target served a second, over the last minute",
                         ("target", "node"))
    write = metrics.gauge("stager_target_write_bytes_per_second",
                          "chunk bytes a target stored a second, over the last minute",
                          ("target", "node"))
    read.clear()        # a target gone (or silent for a minute) has no series
    write.clear()
    for t in targets:
        rate = rates.rates(t.id)
        if rate is not None:
            read.labels(t.id, t.node).set(rate[0])
            write.labels(t.id, t.node).set(rate[1])
    scrub = metrics.gauge("stager_target_scrub_bytes_remaining",
                          "bytes a target's running scrub pass has still to verify",
                          ("target", "node"))
    scrub.clear()
    for t in targets:
        if t.id in rates.scrubs:
            scrub.labels(t.id, t.node).set(rates.scrubs[t.id].bytes_remaining)
    metrics.gauge("stager_rebuild_bytes_remaining",
                  "bytes the rebuild has still to copy").set(rebuild.get("bytes_remaining", 0))
    metrics.gauge("stager_rebuild_bytes_total",
                  "bytes the current rebuild pass copies in all").set(
        rebuild.get("bytes_total", 0))
