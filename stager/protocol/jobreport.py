"""Loader telemetry on the wire: what a loader reports, and how the server checks it.

A loader (one rank of a training job, or one DataLoader worker of a rank) sends
``PUT /v1/jobs/{job}/ranks/{rank}[?worker=W]`` every few seconds with a
compact summary of its ``stats()``; ``GET /v1/jobs`` lists every job with its
live entries (with auth on, those the token may see).  The URL names the entry;
the body carries the numbers, and its ``dataset`` is the path a report needs the
``telemetry`` scope on (:mod:`stager.meta.jobtable` says who may report what).
:func:`parse_report` is the report's model: the fields are tables (below), a
report is the checked dict of them, and unknown fields are dropped so a newer
loader can talk to an older server; the loader builds the same fields
(:mod:`stager.loader.report`).  :class:`RankRecorded` and :class:`JobList` are
the answers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import BadRequest
from .models import field_of

JOB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@+=-]{0,127}$")
MAX_REPORT_BYTES = 64 << 10      # a report is ~1 KiB; anything near this is not one
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


def _number(body: Mapping[str, Any], key: str, integer: bool) -> int | float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            integer and not isinstance(value, int)):
        raise BadRequest(f"field {key!r} must be {'an integer' if integer else 'a number'}")
    if not math.isfinite(value) or value < 0:
        raise BadRequest(f"field {key!r} must be a finite number, not negative")
    return value


def _text(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise BadRequest(f"field {key!r} must be a string of at most {MAX_TEXT} characters")
    return value


def _targets(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_TARGETS:
        raise BadRequest(f"field 'targets' must be a list of at most {MAX_TARGETS} targets")
    out = []
    for item in raw:
        if not isinstance(item, dict):
            raise BadRequest("each of 'targets' must be an object")
        target = _text(item, "target")
        if not target:
            raise BadRequest("each of 'targets' needs a 'target' id")
        entry: dict[str, Any] = {"target": target}
        for key in TARGET_INTS + TARGET_NUMBERS:
            value = _number(item, key, key in TARGET_INTS)
            if value is not None:
                entry[key] = value
        out.append(entry)
    return out


def parse_report(body: Mapping[str, Any], rank: int) -> dict[str, Any]:
    """The checked report: known fields only (unknown ones are dropped, so a newer
    loader can talk to an older server), numbers finite and not negative."""
    for key in REQUIRED:
        if body.get(key) is None:
            raise BadRequest(f"missing field {key!r}")
    out: dict[str, Any] = {}
    for key in INTS + NUMBERS:
        value = _number(body, key, key in INTS)
        if value is not None:
            out[key] = value
    for key in FRACTIONS:
        if out.get(key, 0.0) > 1.0:
            raise BadRequest(f"field {key!r} is a fraction: between 0 and 1")
    for key in TEXTS:
        text = _text(body, key)
        if text is not None:
            out[key] = text
    for key in FLAGS:
        if not isinstance(body.get(key, False), bool):
            raise BadRequest(f"field {key!r} must be true or false")
        out[key] = bool(body.get(key, False))
    if not MIN_INTERVAL <= out["interval"] <= MAX_INTERVAL:
        raise BadRequest(f"field 'interval' must be between {MIN_INTERVAL} and {MAX_INTERVAL}")
    if out["world_size"] < 1 or rank >= out["world_size"]:
        raise BadRequest(f"rank {rank} is outside world_size {out['world_size']}")
    out["targets"] = _targets(body.get("targets"))
    out.setdefault("time_to_first_batch", None)     # null: no batch yet
    return out


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
