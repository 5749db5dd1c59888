"""Live loader telemetry on the metadata server: which training jobs starve for data.

Every reporting loader (a rank, or one DataLoader worker of a rank) owns one
entry, keyed by (job, rank, worker) and replaced by each report it sends
(the ``report_rank`` route).  The ``list_jobs`` route groups the entries by
job with a job-level summary, worst stall first; ``GET /metrics`` exposes each
entry's stall fraction and samples/s as gauges.

The table lives in memory, on purpose: it is live telemetry, rebuilt by the
loaders' next reports within seconds of a restart, and an entry expires after
:data:`~stager.protocol.jobreport.MISSED_REPORTS` report intervals without news
(its loader ended, was killed, or cannot reach us).  With one metadata server
nothing here touches the metadata store.  Where several share one (PostgreSQL),
each report is also written to it (an unlogged table: telemetry need not survive
a database crash) and a listing reads every server's entries back from it, so a
rank reporting to one server is listed by all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from ..errors import Unavailable
from ..protocol.jobreport import (
    MAX_REPORT_BYTES,
    JobList,
    JobStatus,
    RankRecorded,
    check_entry,
    check_job,
    parse_report,
    ttl,
)
from ..web.middleware import METRICS_KEY, json_response
from ..web.requests import read_json
from .store import MetaStore

MAX_ENTRIES = 65536      # reporting loaders at once; bounds the table's memory (~2 KiB each)

Key = tuple[str, int, int | None]


@dataclass
class RankEntry:
    """The last report of one loader."""

    job: str
    rank: int
    worker: int | None
    report: dict[str, Any]
    received: float
    expires: float

    @property
    def state(self) -> str:
        return "closed" if self.report.get("final") else "running"

    def to_json(self, now: float) -> dict[str, Any]:
        return {"job": self.job, "rank": self.rank, "worker": self.worker, **self.report,
                "state": self.state, "received": self.received, "expires": self.expires,
                "age": max(0.0, now - self.received)}


def _stale(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """A report overtaken by a later one of the same loader (a periodic report that
    arrives after the final one, say)."""
    return (old.get("session") is not None and old.get("session") == new.get("session")
            and new.get("seq", 0) <= old.get("seq", 0))


def summarize(entries: list[RankEntry], now: float) -> dict[str, Any]:
    """A job's summary: its worst stall, total samples/s, coverage, last report."""
    worst = max(entries, key=lambda e: e.report.get("stall_fraction", 0.0))
    running = [e for e in entries if e.state == "running"]
    return {
        "worst_stall_fraction": worst.report.get("stall_fraction", 0.0),
        "worst": {"rank": worst.rank, "worker": worst.worker},
        "worst_recent_stall_fraction": max(
            (e.report.get("recent_stall_fraction", 0.0) for e in running), default=0.0),
        "samples_per_second": sum((e.report.get("samples_per_second", 0.0) for e in entries),
                                  0.0),
        "recent_samples_per_second": sum((e.report.get("recent_samples_per_second", 0.0)
                                          for e in running), 0.0),
        "samples": sum(e.report.get("samples", 0) for e in entries),
        "bytes": sum(e.report.get("bytes", 0) for e in entries),
        "entries": len(entries),
        "ranks": len({e.rank for e in entries}),
        "world_size": max(e.report["world_size"] for e in entries),
        "state": "running" if running else "closed",
        "last_report": max(e.received for e in entries),
    }


class JobTable:
    """The live entries, in memory.  Used only from the server's event loop."""

    def __init__(self, clock: Callable[[], float] = time.time,
                 max_entries: int = MAX_ENTRIES, store: MetaStore | None = None) -> None:
        self.clock = clock
        self.max_entries = max_entries
        self.store = store          # shared with other metadata servers, else None
        self._entries: dict[Key, RankEntry] = {}

    async def share(self, entry: RankEntry) -> None:
        """Write ``entry`` to the shared store, for the other metadata servers."""
        if self.store is not None:
            worker = "" if entry.worker is None else str(entry.worker)
            await self.store.put_report(
                f"{entry.job}/{entry.rank}/{worker}",
                {"job": entry.job, "rank": entry.rank, "worker": entry.worker,
                 "report": entry.report, "received": entry.received,
                 "expires": entry.expires},
                expires=entry.expires)

    async def load(self) -> None:
        """Replace the entries by every server's, from the shared store."""
        if self.store is None:
            return
        stored = await self.store.live_reports(self.clock())
        entries = [RankEntry(b["job"], int(b["rank"]), b["worker"], b["report"],
                             float(b["received"]), float(b["expires"]))
                   for b in stored.values()]
        self._entries = {(e.job, e.rank, e.worker): e for e in entries}

    def report(self, job: str, rank: int, worker: int | None,
               report: dict[str, Any]) -> RankEntry:
        """Record a checked report (see :func:`~stager.protocol.jobreport.parse_report`)."""
        now = self.clock()
        self._expire(now)
        key = (job, rank, worker)
        old = self._entries.get(key)
        if old is not None and _stale(old.report, report):
            return old
        if old is None and len(self._entries) >= self.max_entries:
            raise Unavailable(f"{self.max_entries} loaders are reporting already; "
                              "this one is not recorded", limit=self.max_entries)
        entry = RankEntry(job, rank, worker, report, now, now + ttl(report["interval"]))
        self._entries[key] = entry
        return entry

    def _expire(self, now: float) -> None:
        for key in [k for k, e in self._entries.items() if e.expires <= now]:
            del self._entries[key]

    def live(self) -> list[RankEntry]:
        self._expire(self.clock())
        return list(self._entries.values())

    def jobs(self) -> JobList:
        """Every job with its entries (by rank, worker) and summary; worst stall first."""
        now = self.clock()
        by_job: dict[str, list[RankEntry]] = {}
        for entry in self.live():
            by_job.setdefault(entry.job, []).append(entry)
        out = []
        for job, entries in by_job.items():
            entries.sort(key=lambda e: (e.rank, -1 if e.worker is None else e.worker))
            out.append(JobStatus(job, summarize(entries, now),
                                 tuple(e.to_json(now) for e in entries)))
        out.sort(key=lambda j: (-j.summary["worst_stall_fraction"], j.job))
        return JobList(tuple(out))


class JobsCollector:
    """Per-entry gauges for ``GET /metrics``, read from the table when scraped (so an
    expired entry's series disappears with it)."""

    def __init__(self, table: JobTable) -> None:
        self.table = table

    def collect(self) -> Iterator[Metric]:
        labels = ["job", "rank", "worker"]
        stall = GaugeMetricFamily("stager_job_stall_fraction",
                                  "share of a loader's time blocked waiting for data",
                                  labels=labels)
        rate = GaugeMetricFamily("stager_job_samples_per_second",
                                 "samples a loader hands out per second", labels=labels)
        waiting = GaugeMetricFamily("stager_job_waiting_seconds",
                                    "how long a loader's consumer has been waiting now",
                                    labels=labels)
        for e in self.table.live():
            values = [e.job, str(e.rank), "" if e.worker is None else str(e.worker)]
            stall.add_metric(values, e.report.get("stall_fraction", 0.0))
            rate.add_metric(values, e.report.get("samples_per_second", 0.0))
            waiting.add_metric(values, e.report.get("waiting_seconds", 0.0))
        yield from (stall, rate, waiting)


JOBS = web.AppKey("jobs", JobTable)


def install(app: web.Application, store: MetaStore | None = None) -> JobTable:
    """Give the metadata application the jobs table, its routes' state and gauges
    (kept in ``store`` too when other metadata servers share it)."""
    table = JobTable(store=store if store is not None and store.shared else None)
    app[JOBS] = table
    app[METRICS_KEY].registry.register(JobsCollector(table))
    return table


async def report_rank(request: web.Request) -> web.Response:
    job = check_job(request.match_info["job"])
    rank, worker = check_entry(request.match_info["rank"], request.query.get("worker"))
    report = parse_report(await read_json(request, MAX_REPORT_BYTES), rank)
    entry = request.app[JOBS].report(job, rank, worker, report)
    await request.app[JOBS].share(entry)
    return json_response(RankRecorded(job, rank, worker, entry.expires).to_json())


async def list_jobs(request: web.Request) -> web.Response:
    await request.app[JOBS].load()
    return json_response(request.app[JOBS].jobs().to_json())


HANDLERS = {"report_rank": report_rank, "list_jobs": list_jobs}
