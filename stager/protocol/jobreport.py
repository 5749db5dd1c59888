"""Loader telemetry on the wire: what a loader reports, and how the server checks it.

A loader (one rank of a training job, or one DataLoader worker of a rank) sends
``PUT /v1/jobs/{job}/ranks/{rank}[?worker=W]`` every few seconds with a
compact summary of its ``stats()``; ``GET /v1/jobs`` lists every job with its
live entries (with auth on, those the token may see).  The URL names the entry;
the body carries the numbers, and its ``dataset`` is the path a report needs the
``telemetry`` scope on (:mod:`stager.meta.jobtable` says who may report what).
Many loaders' reports go in one ``POST /v1/jobs/reports`` (a node's ranks, or a job
leader's): at a thousand nodes the request, not the report, was most of the cost.
:data:`JobReport` is the report's model, declared once from the field tables below
(msgspec decodes and checks it); unknown fields are dropped so a newer loader can
talk to an older server; the loader builds the same fields
(:mod:`stager.loader.report`).  :class:`RankRecorded` and :class:`JobList` are
the answers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from ..errors import BadRequest
from .batch import MAX_BATCH_ITEMS
from .models import field_of

JOB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@+=-]{0,127}$")
MAX_REPORT_BYTES = 64 << 10      # a report is ~1 KiB; anything near this is not one
MAX_BATCH_BYTES = 8 << 20        # a batch of reports: thousands of ranks of a job leader
MAX_TARGETS = 5                  # the worst targets by mean latency a report carries
MAX_TEXT = 1024                  # longest string field (a dataset path, a host name)
MIN_INTERVAL, MAX_INTERVAL = 0.05, 3600.0
MISSED_REPORTS = 3               # an entry expires after this many intervals without a report
MIN_TTL = 1.0

# field -> kind; every field is optional unless listed in REQUIRED
INTS = ("world_size", "workers", "pid", "samples", "batches", "bytes", "fetches", "epoch",
        "cursor", "dataset_samples", "seq", "reports_failed")
NUMBERS = ("interval", "stall_seconds", "stall_fraction", "waiting_seconds", "fetch_seconds",
           "decode_seconds", "samples_per_second", "recent_samples_per_second",
           "recent_stall_fraction", "time_to_first_batch")
FRACTIONS = ("stall_fraction", "recent_stall_fraction")
TEXTS = ("host", "dataset", "format", "session")
FLAGS = ("final",)
REQUIRED = ("interval", "world_size", "samples")
TARGET_INTS = ("requests", "errors", "bytes")
TARGET_NUMBERS = ("mean_latency",)


def check_job(job: str) -> str:
    if not JOB_RE.match(job):
        raise BadRequest("a job name is 1-128 characters of letters, digits and _.:@+=- "
                         "(starting with a letter or digit)", job=job[:200])
    return job


def check_entry(rank: str, worker: str | None) -> tuple[int, int | None]:
    """(rank, worker) from the URL: non-negative integers."""
    try:
        r = int(rank)
        w = int(worker) if worker not in (None, "") else None
    except ValueError:
        raise BadRequest("rank and worker must be integers") from None
    if r < 0 or (w is not None and w < 0):
        raise BadRequest("rank and worker must not be negative")
    return r, w


def _optional(kind: Any) -> tuple[Any, Any]:
    return kind | None, None


_COUNT = Annotated[int, msgspec.Meta(ge=0)]
_AMOUNT = Annotated[float, msgspec.Meta(ge=0)]     # finite: msgspec refuses 1e400
_FRACTION = Annotated[float, msgspec.Meta(ge=0, le=1)]
_TEXT = Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]

# The report declared once, from the tables above: msgspec decodes and checks a body in
# 1.6 us of CPU, where json.loads and a check field by field took 13 (a report's request
# costs ~100 more).  Unknown fields are dropped; null is absent.
TargetStat = msgspec.defstruct(
    "TargetStat",
    [("target", Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEXT)]),
     *((k, *_optional(_COUNT)) for k in TARGET_INTS),
     *((k, *_optional(_AMOUNT)) for k in TARGET_NUMBERS)],
    omit_defaults=True, module=__name__)
JobReport = msgspec.defstruct(
    "JobReport",
    [("interval", Annotated[float, msgspec.Meta(ge=MIN_INTERVAL, le=MAX_INTERVAL)]),
     ("world_size", Annotated[int, msgspec.Meta(ge=1)]), ("samples", _COUNT),
     *((k, *_optional(_COUNT)) for k in INTS if k not in REQUIRED),
     *((k, *_optional(_FRACTION if k in FRACTIONS else _AMOUNT))
       for k in NUMBERS if k not in REQUIRED),
     *((k, *_optional(_TEXT)) for k in TEXTS),
     *((k, bool, False) for k in FLAGS),
     ("targets", Annotated[list[TargetStat], msgspec.Meta(max_length=MAX_TARGETS)] | None,
      None)],
    omit_defaults=True, module=__name__)


class ReportItem(msgspec.Struct):
    """One loader's report in a batch (``POST /v1/jobs/reports``)."""

    job: str
    rank: _COUNT
    report: JobReport      # type: ignore[valid-type]
    worker: _COUNT | None = None


class ReportBatch(msgspec.Struct):
    items: Annotated[list[ReportItem], msgspec.Meta(max_length=MAX_BATCH_ITEMS)]


_ITEM_AT = re.compile(r"at `\$\.items\[(\d+)\]")
_decode_report = msgspec.json.Decoder(JobReport).decode
_decode_batch = msgspec.json.Decoder(ReportBatch).decode
_convert = msgspec.to_builtins


def _checked(report: Any, rank: int) -> dict[str, Any]:
    """The report as the table keeps it: a dict of the fields sent, ``final`` and
    ``targets`` always there, ``time_to_first_batch`` null until the first batch."""
    if rank >= report.world_size:
        raise BadRequest(f"rank {rank} is outside world_size {report.world_size}")
    out: dict[str, Any] = _convert(report)
    out["final"] = report.final
    out.setdefault("targets", [])
    out.setdefault("time_to_first_batch", None)     # null: no batch yet
    return out


def _invalid(exc: msgspec.ValidationError) -> BadRequest:
    """msgspec's message names the field (``... - at `$.samples```)."""
    return BadRequest(f"invalid report: {exc}")


def decode_report(raw: bytes | bytearray, rank: int) -> dict[str, Any]:
    """The checked report of one loader (``PUT /v1/jobs/{job}/ranks/{rank}``) from its
    body.  Malformed JSON raises :class:`msgspec.DecodeError`, for the caller's strict
    parser to name the fault; a body that does not fit the model is a BadRequest."""
    try:
        report = _decode_report(raw)
    except msgspec.ValidationError as exc:
        raise _invalid(exc) from None
    return _checked(report, rank)


def parse_report(body: Mapping[str, Any], rank: int) -> dict[str, Any]:
    """The checked report from a parsed body: known fields only (unknown ones are
    dropped, so a newer loader can talk to an older server), numbers finite and not
    negative."""
    try:
        report = msgspec.convert(body, JobReport)
    except msgspec.ValidationError as exc:
        raise _invalid(exc) from None
    return _checked(report, rank)


@dataclass(frozen=True)
class RankReport:
    """A checked item of a batch: the entry it goes to, and its report."""

    job: str
    rank: int
    worker: int | None
    report: dict[str, Any]

    @property
    def key(self) -> tuple[str, int, int | None]:
        return self.job, self.rank, self.worker


def decode_batch(raw: bytes | bytearray) -> list[RankReport]:
    """The checked items of a batch of reports (``POST /v1/jobs/reports``).  Like every
    batch (:mod:`stager.protocol.batch`) it is checked whole: the first bad item, or an
    entry named twice, fails the request with its index.  Malformed JSON raises
    :class:`msgspec.DecodeError`, as :func:`decode_report`."""
    try:
        items = _decode_batch(raw).items
    except msgspec.ValidationError as exc:
        where = _ITEM_AT.search(str(exc))       # `$.items[3].report.samples`: item 3
        if where is None:
            raise _invalid(exc) from None
        index = int(where.group(1))
        raise BadRequest(f"item {index}: {_invalid(exc).message}", index=index) from None
    out: list[RankReport] = []
    seen: dict[tuple[str, int, int | None], int] = {}
    for index, item in enumerate(items):
        try:
            one = RankReport(check_job(item.job), item.rank, item.worker,
                             _checked(item.report, item.rank))
        except BadRequest as exc:
            raise BadRequest(f"item {index}: {exc.message}",
                             **{**exc.details, "index": index}) from None
        if one.key in seen:
            raise BadRequest(f"item {index}: the entry {one.key} is also item "
                             f"{seen[one.key]} of this batch", index=index, other=seen[one.key])
        seen[one.key] = index
        out.append(one)
    return out


def batch_item(job: str, rank: int, report: Mapping[str, Any],
               worker: int | None = None) -> dict[str, Any]:
    """One item of a batch as a reporter sends it (what :func:`decode_batch` reads)."""
    item = {"job": job, "rank": rank, "report": dict(report)}
    return item if worker is None else {**item, "worker": worker}


def ttl(interval: float) -> float:
    """Seconds an entry lives without a new report."""
    return max(MIN_TTL, MISSED_REPORTS * interval)


@dataclass(frozen=True)
class RankRecorded:
    """The answer to a report: the entry it went to, and when that entry expires."""

    job: str
    rank: int
    worker: int | None
    expires: float

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job, "rank": self.rank, "worker": self.worker,
                "expires": self.expires}

    @classmethod
    def from_json(cls, obj: Any) -> RankRecorded:
        return cls(field_of(obj, "job", str), field_of(obj, "rank", int),
                   field_of(obj, "worker", int, None), field_of(obj, "expires", (int, float)))


@dataclass(frozen=True)
class JobStatus:
    """One job: its summary, and its live entries (a report each, with ``job``,
    ``rank``, ``worker``, ``state``, ``received``, ``expires`` and ``age`` added)."""

    job: str
    summary: dict[str, Any]
    ranks: tuple[dict[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job, "summary": dict(self.summary), "ranks": list(self.ranks)}

    @classmethod
    def from_json(cls, obj: Any) -> JobStatus:
        ranks = field_of(obj, "ranks", list)
        if not all(isinstance(r, dict) for r in ranks):
            raise BadRequest("field 'ranks' must be a list of objects")
        return cls(field_of(obj, "job", str), dict(field_of(obj, "summary", dict)), tuple(ranks))


@dataclass(frozen=True)
class JobList:
    """Every job with live entries, worst stall first."""

    jobs: tuple[JobStatus, ...]

    def to_json(self) -> dict[str, Any]:
        return {"jobs": [j.to_json() for j in self.jobs]}

    @classmethod
    def from_json(cls, obj: Any) -> JobList:
        return cls(tuple(JobStatus.from_json(j) for j in field_of(obj, "jobs", list)))


_INT = {"type": "integer", "minimum": 0}
_NUM = {"type": "number", "minimum": 0}
_TARGET = {"type": "object", "required": ["target"], "properties": {
    "target": {"type": "string"}, **{k: _INT for k in TARGET_INTS},
    **{k: _NUM for k in TARGET_NUMBERS}}}
_REPORT_PROPS: dict[str, Any] = {
    **{k: _INT for k in INTS}, **{k: _NUM for k in NUMBERS},
    **{k: {"type": "number", "minimum": 0, "maximum": 1} for k in FRACTIONS},
    "time_to_first_batch": {"type": ["number", "null"], "minimum": 0},
    **{k: {"type": "string", "maxLength": MAX_TEXT} for k in TEXTS},
    **{k: {"type": "boolean"} for k in FLAGS},
    "targets": {"type": "array", "maxItems": MAX_TARGETS, "items": _TARGET},
}
_ENTRY = {"type": "object", "properties": {
    "job": {"type": "string"}, "rank": _INT, "worker": {"type": ["integer", "null"]},
    "received": _NUM, "expires": _NUM, "age": _NUM, **_REPORT_PROPS}}
_SUMMARY = {"type": "object", "properties": {
    k: _NUM for k in ("worst_stall_fraction", "worst_recent_stall_fraction",
                      "samples_per_second", "recent_samples_per_second", "samples", "bytes",
                      "last_report", "entries", "ranks", "world_size")} | {
    "state": {"enum": ["running", "closed"]},
    "worst": {"type": "object", "properties": {"rank": _INT,
                                               "worker": {"type": ["integer", "null"]}}}}}

#: OpenAPI schemas of the jobs routes (merged into :data:`stager.protocol.openapi.SCHEMAS`)
SCHEMAS: dict[str, Any] = {
    "JobReport": {"type": "object", "required": list(REQUIRED), "properties": _REPORT_PROPS,
                  "description": f"at most {MAX_REPORT_BYTES} bytes; unknown fields are "
                                 "ignored; the entry expires after "
                                 f"{MISSED_REPORTS} intervals without a report"},
    "JobReportBatch": {"type": "object", "required": ["items"], "properties": {"items": {
        "type": "array", "maxItems": MAX_BATCH_ITEMS, "items": {
            "type": "object", "required": ["job", "rank", "report"], "properties": {
                "job": {"type": "string", "pattern": JOB_RE.pattern}, "rank": _INT,
                "worker": {"type": ["integer", "null"], "minimum": 0},
                "report": {"$ref": "#/components/schemas/JobReport"}}}}},
        "description": f"at most {MAX_BATCH_BYTES} bytes; checked whole (the first bad "
                       "item fails the request, its index in details); each item "
                       "answers a RankRecorded or its error, in order"},
    "JobEntry": _ENTRY,
    "RankRecorded": {"type": "object", "required": ["job", "rank", "worker", "expires"],
                     "properties": {"job": {"type": "string"}, "rank": _INT,
                                    "worker": {"type": ["integer", "null"]}, "expires": _NUM}},
    "JobStatus": {"type": "object", "required": ["job", "summary", "ranks"], "properties": {
        "job": {"type": "string"}, "summary": _SUMMARY,
        "ranks": {"type": "array", "items": _ENTRY}}},
    "JobList": {"type": "object", "required": ["jobs"], "properties": {"jobs": {
        "type": "array", "items": {"$ref": "#/components/schemas/JobStatus"}}}},
}
