"""Live loader telemetry on the metadata server: which training jobs starve for data.

Every reporting loader (a rank, or one DataLoader worker of a rank) owns one
entry, keyed by (job, rank, worker) and replaced by each report it sends
(the ``report_rank`` route).  The ``list_jobs`` route groups the entries by
job with a job-level summary, worst stall first; ``GET /metrics`` exposes each
entry's stall fraction and samples/s as gauges.

The table lives in memory, on purpose: it is live telemetry, rebuilt by the
loaders' next reports within seconds of a restart, and an entry expires after
:data:`~stager.protocol.jobreport.MISSED_REPORTS` report intervals without news
(its loader ended, was killed, or cannot reach us).

With auth on, a report needs the ``telemetry`` scope (``write`` and ``admin``
imply it) on the dataset path it names (on ``/`` when it names none), and a job
belongs to the token that reported it first, for as long as it has live
entries: a report into it from any other token is a 403, so no one can add ranks
to, or overwrite, another team's job.  A listing shows a token the entries it
reported and those whose dataset it may read (:func:`may_see`).

With one metadata server
nothing here touches the metadata store.  Where several share one (PostgreSQL),
each report is also written to it (an unlogged table: telemetry need not survive
a database crash) and a listing reads every server's entries back from it, so a
rank reporting to one server is listed by all.  A server learns who owns a job it
has not seen from there too, before it records the first report for it; should
two servers still have let two tokens claim one job at once, the earlier claim
wins when the entries are read back.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from aiohttp import web
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from ..auth import Token
from ..auth.policy import allows
from ..errors import (
    BadRequest,
    Forbidden,
    InvalidPath,
    PayloadTooLarge,
    StagerError,
    Unavailable,
)
from ..protocol.batch import one, results_json
from ..protocol.jobreport import (
    MAX_BATCH_BYTES,
    MAX_REPORT_BYTES,
    JobList,
    JobStatus,
    RankRecorded,
    RankReport,
    check_entry,
    check_job,
    decode_batch,
    decode_report,
    ttl,
)
from ..protocol.paths import normalize
from ..web.authmw import authorize, token_of
from ..web.middleware import METRICS_KEY, json_response
from ..web.requests import PARSE_AWAY, parse_json, read_body
from .store.servers import SharedState

MAX_ENTRIES = 65536      # reporting loaders at once; bounds the table's memory (~2 KiB each)
YIELD_EVERY = 256        # reports of a batch taken between two turns of the event loop
T = TypeVar("T")

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
    owner: str | None = None    # the id of the token that reports the job (None: auth off)
    since: float = 0.0          # when that token first reported the job

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


@dataclass
class Claim:
    """Who reports a job, since when, and how many live entries it has: the claim
    lasts as long as they do."""

    owner: str | None
    since: float
    entries: int = 0


def may_see(token: Token | None, entry: RankEntry) -> bool:
    """Does a listing show ``entry`` to ``token`` (``None``: auth off)?  Its own
    reports, and those of datasets it may read (a report naming none: a token that
    reads everything)."""
    if token is None or entry.owner == token.id:
        return True
    dataset = entry.report.get("dataset")
    try:
        return allows(token, "read", None if dataset is None else normalize(dataset))
    except InvalidPath:
        return False


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
                 max_entries: int = MAX_ENTRIES, store: SharedState | None = None) -> None:
        self.clock = clock
        self.max_entries = max_entries
        self.store = store          # shared with other metadata servers, else None
        self._entries: dict[Key, RankEntry] = {}
        self._claims: dict[str, Claim] = {}
        # (expires, key) per entry, earliest first: a sweep looks only at what is due.
        # One item per entry, pushed when the entry is made and again when it comes
        # due but a later report has moved its expiry on; not one per report: an item
        # kept for a report's ttl outlives the garbage collector's young generations,
        # whose collections, at thousands of reports a second, held the event loop
        # several times a second (bench scale)
        self._due: list[tuple[float, int, Key]] = []
        self._seq = itertools.count()      # ties never compare keys (None vs int)

    async def share(self, *entries: RankEntry) -> None:
        """Write ``entries`` to the shared store, for the other metadata servers: in one
        write (a batch of reports costs one round trip, not one per report)."""
        if self.store is not None and entries:
            await self.store.put_reports([(
                f"{e.job}/{e.rank}/{'' if e.worker is None else e.worker}",
                {"job": e.job, "rank": e.rank, "worker": e.worker, "report": e.report,
                 "received": e.received, "expires": e.expires, "owner": e.owner,
                 "since": e.since}, e.expires) for e in entries])

    async def load(self) -> None:
        """Replace the entries by every server's, from the shared store."""
        if self.store is None:
            return
        stored = await self.store.live_reports(self.clock())
        entries = [RankEntry(b["job"], int(b["rank"]), b["worker"], b["report"],
                             float(b["received"]), float(b["expires"]), b.get("owner"),
                             float(b.get("since", b["received"])))
                   for b in stored.values()]
        # the earliest claim of each job wins (two servers may each have let one in)
        first: dict[str, RankEntry] = {}
        for e in sorted(entries, key=lambda e: (e.since, e.owner or "")):
            first.setdefault(e.job, e)
        self._entries, self._claims = {}, {}
        for e in entries:
            if e.owner == first[e.job].owner:
                self._entries[(e.job, e.rank, e.worker)] = e
                self._claim(e.job, e.owner, e.since).entries += 1
        self._due = [(e.expires, next(self._seq), k) for k, e in self._entries.items()]
        heapq.heapify(self._due)

    def knows(self, job: str) -> bool:
        """Has ``job`` live entries here (so its owner is known without the store)?"""
        return job in self._claims

    def report(self, job: str, rank: int, worker: int | None, report: dict[str, Any],
               owner: str | None = None) -> RankEntry:
        """Record a checked report (see :func:`~stager.protocol.jobreport.parse_report`)
        sent with the token ``owner`` (its id; ``None`` with auth off).  A job with live
        entries takes reports from its owner only: :class:`Forbidden` for the rest."""
        now = self.clock()
        self._expire(now)
        claim = self._claims.get(job)
        if claim is not None and claim.owner != owner:
            raise Forbidden(f"job {job} belongs to another token", job=job)
        key = (job, rank, worker)
        old = self._entries.get(key)
        if old is not None and _stale(old.report, report):
            return old
        if old is None and len(self._entries) >= self.max_entries:
            raise Unavailable(f"{self.max_entries} loaders are reporting already; "
                              "this one is not recorded", limit=self.max_entries)
        claim = self._claim(job, owner, now)
        entry = RankEntry(job, rank, worker, report, now, now + ttl(report["interval"]),
                          owner, claim.since)
        if old is None:
            claim.entries += 1
        if old is None or entry.expires < old.expires:     # else its item is due first
            heapq.heappush(self._due, (entry.expires, next(self._seq), key))
        self._entries[key] = entry
        return entry

    def _claim(self, job: str, owner: str | None, since: float) -> Claim:
        claim = self._claims.get(job)
        if claim is None:
            claim = self._claims[job] = Claim(owner, since)
        return claim

    def _expire(self, now: float) -> None:
        """Drop the entries expired by ``now``: O(log n) per entry come due, not a scan
        of every entry on every report (it led a metadata server's CPU per report)."""
        due = self._due
        while due and due[0][0] <= now:
            _, _, key = heapq.heappop(due)
            entry = self._entries.get(key)
            if entry is None:
                continue
            if entry.expires > now:         # reported since: due again at its new expiry
                heapq.heappush(due, (entry.expires, next(self._seq), key))
                continue
            del self._entries[key]
            claim = self._claims[key[0]]
            claim.entries -= 1
            if claim.entries == 0:
                del self._claims[key[0]]

    def live(self) -> list[RankEntry]:
        self._expire(self.clock())
        return list(self._entries.values())

    def jobs(self, shown: Callable[[RankEntry], bool] = lambda e: True) -> JobList:
        """Every job with its entries (by rank, worker) and summary, worst stall first;
        only the entries ``shown`` keeps."""
        now = self.clock()
        by_job: dict[str, list[RankEntry]] = {}
        for entry in filter(shown, self.live()):
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


def install(app: web.Application, store: SharedState | None = None) -> JobTable:
    """Give the metadata application the jobs table, its routes' state and gauges
    (kept in ``store`` too when other metadata servers share it)."""
    table = JobTable(store=store if store is not None and store.shared else None)
    app[JOBS] = table
    app[METRICS_KEY].registry.register(JobsCollector(table))
    return table


async def _decoded(request: web.Request, max_size: int, decode: Callable[[bytes], T]) -> T:
    """A body decoded by ``decode`` (msgspec: a report in 1.6 us of CPU); a large batch's off the
    loop, so the stats waiting behind it do not wait for its decoding."""
    raw = bytes(await read_body(request, max_size))
    if len(raw) > max_size:         # a chunked body has no length to refuse up front
        raise PayloadTooLarge(f"JSON body over {max_size} bytes", limit=max_size)
    try:
        return decode(raw) if len(raw) <= PARSE_AWAY else await asyncio.to_thread(decode, raw)
    except msgspec.DecodeError:
        parse_json(raw)     # the strict parser names the fault (NaN, a lone surrogate, ...)
        raise BadRequest("malformed JSON") from None


async def _record(request: web.Request, items: list[RankReport]
                  ) -> list[RankRecorded | StagerError]:
    """Take checked reports, in order: one home for the single route and the batch.
    Each dataset is authorized before any report is taken (a refusal refuses the
    request); a job another token reports, or a full table, fails its own item."""
    token, table = token_of(request), request.app[JOBS]
    if token is not None:
        for dataset in {i.report.get("dataset") for i in items}:
            authorize(request, "telemetry", dataset)
        for item in items:
            if item.report.get("dataset") is not None:
                item.report["dataset"] = normalize(item.report["dataset"])
        if table.store is not None and not all(table.knows(i.job) for i in items):
            await table.load()      # another metadata server may know an owner
    owner = None if token is None else token.id
    results: list[RankRecorded | StagerError] = []
    taken: list[RankEntry] = []
    for index, item in enumerate(items):
        if index and index % YIELD_EVERY == 0:
            await asyncio.sleep(0)      # a stat waits for at most YIELD_EVERY reports
        try:
            entry = table.report(item.job, item.rank, item.worker, item.report, owner)
        except StagerError as exc:
            results.append(exc)
            continue
        taken.append(entry)
        results.append(RankRecorded(item.job, item.rank, item.worker, entry.expires))
    await table.share(*taken)       # one write for the batch (none without a shared store)
    return results


async def report_rank(request: web.Request) -> web.Response:
    job = check_job(request.match_info["job"])
    rank, worker = check_entry(request.match_info["rank"], request.query.get("worker"))
    report = await _decoded(request, MAX_REPORT_BYTES, lambda raw: decode_report(raw, rank))
    return json_response(one(await _record(request, [RankReport(job, rank, worker, report)]))
                         .to_json())


async def report_ranks(request: web.Request) -> web.Response:
    """Many loaders' reports in one request (a node's ranks, or a job leader's): the
    request's cost paid once for all of them."""
    items = await _decoded(request, MAX_BATCH_BYTES, decode_batch)
    return json_response(results_json(await _record(request, items), RankRecorded.to_json))


async def list_jobs(request: web.Request) -> web.Response:
    token = token_of(request)
    await request.app[JOBS].load()
    return json_response(request.app[JOBS].jobs(lambda e: may_see(token, e)).to_json())


HANDLERS = {"report_rank": report_rank, "report_ranks": report_ranks, "list_jobs": list_jobs}
