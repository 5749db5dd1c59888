"""Per-server Prometheus metrics: requests, latencies and bytes, per route and target."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class ServerMetrics:
    """The metrics one server exposes on ``GET /metrics``."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.registry = CollectorRegistry()
        self.requests = Counter("stager_requests", "HTTP requests served",
                                ["op", "status"], registry=self.registry)
        self.latency = Histogram("stager_request_seconds", "time to serve a request",
                                 ["op"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.bytes_in = Counter("stager_received_bytes", "request body bytes received",
                                ["target"], registry=self.registry)
        self.bytes_out = Counter("stager_sent_bytes", "response body bytes sent",
                                 ["target"], registry=self.registry)
        self.gauges: dict[str, Gauge] = {}
        # (op, status) -> the two children a request counts in: labels() locks and
        # builds its key on every call, a good part of a small request's middleware time
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._in: dict[str, Any] = {}           # target -> its bytes_in child
        self._out: dict[str, Any] = {}          # target -> its bytes_out child

    def observe(self, op: str, status: int, seconds: float) -> None:
        """Count one request of ``op`` answered with ``status`` in ``seconds``."""
        pair = self._children.get((op, status))
        if pair is None:
            pair = self._children[op, status] = (self.requests.labels(op, str(status)),
                                                 self.latency.labels(op))
        pair[0].inc()
        pair[1].observe(seconds)

    def received(self, target: str, nbytes: int) -> None:
        """Count ``nbytes`` of request body received for ``target`` (its child kept, as
        :meth:`observe` keeps its own)."""
        child = self._in.get(target)
        if child is None:
            child = self._in[target] = self.bytes_in.labels(target)
        child.inc(nbytes)

    def sent(self, target: str, nbytes: int) -> None:
        """Count ``nbytes`` of response body sent for ``target`` (as :meth:`received`)."""
        child = self._out.get(target)
        if child is None:
            child = self._out[target] = self.bytes_out.labels(target)
        child.inc(nbytes)

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        if name not in self.gauges:
            self.gauges[name] = Gauge(name, doc, list(labels), registry=self.registry)
        return self.gauges[name]

    def render(self) -> bytes:
        return generate_latest(self.registry)
