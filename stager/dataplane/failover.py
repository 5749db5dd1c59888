"""Where one read plan's run stands across its rounds: pieces read, replicas tried,
errors seen per chunk, and what a reader is told when no replica could serve a chunk
(used by :class:`.engine.ReadEngine`, the one executor of read plans)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..errors import ChunkNotFound, CorruptChunk, StagerError, TargetUnavailable
from .readplan import ReadPlan


def final_error(name: str, errors: Sequence[StagerError]) -> StagerError:
    """What a reader sees when chunk ``name`` could not be read from any replica."""
    if errors and all(isinstance(e, CorruptChunk) for e in errors):
        return CorruptChunk(f"every replica of chunk {name} is corrupt", chunk=name)
    last = errors[-1] if errors else TargetUnavailable(f"no replica of {name} is reachable")
    targets = sorted({str(e.details.get("target")) for e in errors if e.details.get("target")})
    if isinstance(last, TargetUnavailable | ChunkNotFound):
        return TargetUnavailable(f"chunk {name} unavailable: {last}", chunk=name,
                                 targets=targets, target=targets[0] if targets else None)
    return last


class Failover:
    """Where one plan's run stands: the pieces read, and per chunk the replicas
    tried this round and the errors seen."""

    def __init__(self, plan: ReadPlan) -> None:
        self.chunks = plan.chunks
        self.done = np.zeros(len(plan), dtype=bool)
        self.left = len(plan)                # pieces not done (cheaper than done.all())
        self.untouched = True                # no piece done yet
        self.tried: dict[int, set[str]] = {}
        self.errors: dict[int, list[StagerError]] = {}
        self.dead: set[int] = set()          # chunks of cached files their fill failed for
        self.recalled: set[int] = set()      # chunks of cached files read by a learnt CRC32C
        self.doubt: set[int] = set()         # of those, the ones a target had not: ask again

    def read(self, ids: np.ndarray) -> None:
        self.done[ids] = True
        self.left -= len(ids)
        self.untouched = False

    def failed(self, rows: np.ndarray, target: str, error: StagerError) -> None:
        for c in rows.tolist():
            self.tried.setdefault(c, set()).add(target)
            self.errors.setdefault(c, []).append(error)

    def assign(self, rows: Sequence[int], order: Callable[[Sequence[str]], list[str]],
               last: bool,
               ) -> tuple[dict[str, list[int]], set[int]]:
        """Each chunk's next target (grouped by target) and the chunks to be
        patient for: no other replica is left to try after this one."""
        groups: dict[str, list[int]] = {}
        patient: set[int] = set()
        for c in rows:
            if c in self.dead or c in self.doubt:
                continue
            replicas = self.chunks.replicas[c]
            tried = self.tried.get(c)
            left = [t for t in replicas if t not in tried] if tried else replicas
            if not left:
                continue
            groups.setdefault(order(left)[0], []).append(c)
            if len(set(replicas)) == 1 or (last and len(left) == 1):
                patient.add(c)
        return groups, patient

    def hopeless(self, c: int) -> bool:
        """Every replica answered, each with bad bytes: retrying will not help."""
        if c in self.dead:
            return True
        errors = self.errors.get(c, [])
        return bool(errors) and all(isinstance(e, CorruptChunk) for e in errors)

    def blame(self, rows: np.ndarray, names: list[str], error: StagerError) -> np.ndarray:
        """The chunks of a failed request that failed.  A target that misses a chunk
        answers 404 naming the first one it misses, before sending anything: that one
        failed; when it was read by a learnt CRC32C, it was likely evicted since, and so
        may every chunk of the request read that way: all of those are put in doubt
        (asked of the metadata server again).  The other chunks of the request are not
        blamed, and are asked for again at once."""
        named = error.details.get("chunk") if isinstance(error, ChunkNotFound) else None
        if named is None or not self.recalled:
            return rows
        listed = rows.tolist()
        hit = [c for c in listed if names[c] == named]
        if not hit:
            return rows
        if hit[0] in self.recalled:
            self.doubt.update(c for c in listed if c in self.recalled)
            return rows[:0]
        return np.asarray(hit, dtype=rows.dtype)

    def give_up(self, rows: Sequence[int], error: StagerError) -> None:
        """Chunks ``rows`` cannot be read at all (their source failed): ``error`` each."""
        for c in rows:
            self.dead.add(c)
            self.errors[c] = [error]
