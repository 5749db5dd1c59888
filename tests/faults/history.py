"""A Jepsen-style history: every operation the writers tried, and a checker for it.

Writers and readers record each operation as an :class:`Op`: who, what kind
(``pipe``, ``put``, ``write_many``, ``open_wb``, ``read``, ``final_read``), which
path, the SHA-256 of the bytes written (or read; ``None`` for a read that found
no file), when it started and ended (monotonic seconds from the history's
start) and its outcome:

* ``ack``: the call returned normally (a read: it answered, found or not);
* ``fail``: the call raised an error; the write may still have taken effect
  (its commit may have reached the metadata server before the answer was lost);
* ``unknown``: no answer (timed out or still running when the run stopped).

A failed or unknown write is *indeterminate*: it may take effect at any time
after it started, so it is never taken as ended.  :func:`check` judges every
read that answered against the writes to its path, in real time:

* ``lost_ack``: the read found no file (or, at the end, could not read it) although
  a write of the path had surely taken effect before the read began: it was
  acknowledged, or an earlier read returned its bytes;
* ``torn``: the read returned bytes no write of the path wrote whole, e.g. part of
  an unacknowledged write;
* ``stale``: the bytes are a write's, but another write started after that one
  had surely taken effect and had itself surely taken effect before the read
  began, so it must have replaced them (writes overwrite; nothing deletes).

This judges each read against the writes, not the reads against one another as
a full linearizability checker would; an earlier read that returned a write's
bytes does date that write, which catches most read-after-read anomalies.

The faults a nemesis injected are kept beside the ops, for the summary.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

WRITE_KINDS = frozenset({"pipe", "put", "write_many", "open_wb"})
READ_KINDS = frozenset({"read", "final_read"})
OUTCOMES = ("ack", "fail", "unknown")


def sha(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Op:
    writer: str
    kind: str
    path: str
    sha256: str | None
    start: float
    end: float = math.inf
    outcome: str = "unknown"
    detail: str = ""

    @property
    def settled_by(self) -> float:
        """When the op had surely taken effect: its end if acknowledged; an
        indeterminate write may take effect at any later time."""
        return self.end if self.outcome == "ack" else math.inf

    def __str__(self) -> str:
        end = "…" if math.isinf(self.end) else f"{self.end:.3f}"
        digest = self.sha256[:12] if self.sha256 else "absent"
        tail = f" ({self.detail})" if self.detail else ""
        return (f"{self.writer} {self.kind} {self.path} {digest} "
                f"[{self.start:.3f}, {end}] {self.outcome}{tail}")


@dataclass
class Fault:
    kind: str             # kill9_data | hang_data | kill9_meta
    victim: str
    start: float
    end: float = math.inf

    def __str__(self) -> str:
        return f"{self.kind} {self.victim} [{self.start:.3f}, {self.end:.3f}]"


@dataclass(frozen=True)
class Violation:
    kind: str             # lost_ack | torn | stale
    read: Op
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.read} — {self.detail}"


@dataclass
class History:
    """Ops and faults, timed from the history's creation."""

    seed: int = 0
    ops: list[Op] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def begin(self, writer: str, kind: str, path: str, digest: str | None = None) -> Op:
        op = Op(writer, kind, path, digest, self.now())
        self.ops.append(op)
        return op

    def finish(self, op: Op, outcome: str, detail: str = "",
               digest: str | None = None) -> None:
        assert outcome in OUTCOMES, outcome
        op.end, op.outcome, op.detail = self.now(), outcome, detail
        if op.kind in READ_KINDS:
            op.sha256 = digest

    def dump(self, path: str | os.PathLike[str]) -> None:
        """The whole history, one op or fault a line, for reading after a run."""
        with open(path, "w") as f:
            for item in sorted([*self.ops, *self.faults], key=lambda x: x.start):
                f.write(f"{type(item).__name__.lower()} {item}\n")

    @contextmanager
    def fault(self, kind: str, victim: str) -> Iterator[Fault]:
        f = Fault(kind, victim, self.now())
        self.faults.append(f)
        try:
            yield f
        finally:
            f.end = self.now()


def check(history: History) -> list[Violation]:
    """Every violation of the history's reads against its writes (see the module)."""
    writes: dict[str, list[Op]] = {}
    for op in history.ops:
        if op.kind in WRITE_KINDS:
            writes.setdefault(op.path, []).append(op)
    seen: dict[tuple[str, str | None], float] = {}    # (path, sha) → first read's end
    for op in history.ops:
        if op.kind in READ_KINDS and op.outcome == "ack":
            key = (op.path, op.sha256)
            seen[key] = min(seen.get(key, math.inf), op.end)
    done = {id(w): min(w.settled_by, seen.get((w.path, w.sha256), math.inf))
            for ws in writes.values() for w in ws}
    out = []
    for read in history.ops:
        if read.kind in READ_KINDS:
            v = _judge(read, writes.get(read.path, []), done)
            if v is not None:
                out.append(v)
    return out


def _judge(read: Op, writes: list[Op], done: dict[int, float]) -> Violation | None:
    """``done``: by when each write had surely taken effect: its acknowledgement,
    or the end of the first read that returned its bytes."""
    before = [w for w in writes if done[id(w)] < read.start]
    if read.outcome != "ack":
        if read.kind == "final_read" and before:
            return Violation("lost_ack", read, f"unreadable at the end; written: {before[-1]}")
        return None                   # a read during faults may fail
    if read.sha256 is None:
        if before:
            return Violation("lost_ack", read, f"no file; written: {before[-1]}")
        return None
    candidates = [w for w in writes if w.sha256 == read.sha256 and w.start < read.end]
    if not candidates:
        return Violation("torn", read, f"bytes no write of the path begun before the read "
                                       f"ended wrote whole ({len(writes)} writes of it)")
    for w in candidates:
        later = [a for a in before if a.sha256 != w.sha256 and a.start > done[id(w)]]
        if not later:
            return None
    return Violation("stale", read, f"wrote: {candidates[-1]}; replaced by: {later[-1]}")


def summary(history: History, violations: list[Violation]) -> dict[str, Any]:
    """Counts for the report: ops by kind and outcome, faults by kind, violations."""
    kinds = Counter(op.kind for op in history.ops)
    outcomes = Counter(f"{op.kind}:{op.outcome}" for op in history.ops)
    writes = [op for op in history.ops if op.kind in WRITE_KINDS]
    return {
        "seed": history.seed,
        "seconds": round(history.now(), 1),
        "ops": len(history.ops),
        "writes": len(writes),
        "acks": sum(op.outcome == "ack" for op in writes),
        "write_fail": sum(op.outcome == "fail" for op in writes),
        "write_unknown": sum(op.outcome == "unknown" for op in writes),
        "reads": kinds["read"] + kinds["final_read"],
        "by_kind": {k: {o: outcomes[f"{k}:{o}"] for o in OUTCOMES if outcomes[f"{k}:{o}"]}
                    for k in sorted(kinds)},
        "fail_reasons": dict(Counter(op.detail.split(":")[0] for op in history.ops
                                     if op.outcome != "ack").most_common(6)),
        "paths": len({op.path for op in writes}),
        "faults": dict(Counter(f.kind for f in history.faults)),
        "acks_during": {kind: sum(any(f.kind == kind and op.start < f.end and op.end > f.start
                                      for f in history.faults) for op in writes
                                  if op.outcome == "ack")
                        for kind in sorted({f.kind for f in history.faults})},
        "slowest_ack_s": round(max((op.end - op.start for op in writes
                                    if op.outcome == "ack"), default=0.0), 2),
        "violations": len(violations),
        "violation_kinds": dict(Counter(v.kind for v in violations)),
    }


def format_summary(history: History, violations: list[Violation], limit: int = 20) -> str:
    lines = ["history summary:"]
    lines += [f"  {k}: {v}" for k, v in summary(history, violations).items()]
    for v in violations[:limit]:
        lines.append(f"  VIOLATION {v}")
        lines += [f"      {op}" for op in history.ops
                  if op.path == v.read.path and op.kind in WRITE_KINDS][-6:]
    return "\n".join(lines)
