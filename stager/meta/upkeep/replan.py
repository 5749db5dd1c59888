"""Re-placement after a target is lost: pure functions, registered by name.

A file's layout names its targets by stripe slot; a reader computes chunk
*i*'s replicas from the layout alone (:func:`stager.layout.chunk_targets`).
When a target is lost, the rebuild puts another target into its slot.  That
can change which slots hold which chunk (replicas go to the next slots of
*other nodes*, and the new target's node may differ), so the rebuild never
assumes: it compares where each chunk must be under the new layout with where
surviving copies are under the old one, and copies exactly the difference
(:func:`copies_needed`) before the new layout is swapped in.

The replacement may be a target the layout already uses (the same target then
fills two slots): with three nodes and one lost, that is the only way back to
two replicas on distinct nodes.

A rebuild places the copies of many files in one round, on targets whose free
space it knows only from their last heartbeat: a policy is also told what the
round has already ``placed`` on each target (bytes), so that the copies spread
over the targets instead of all going to the one with the most free space at
the start (:func:`spread_by_free_space`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from ...layout import chunk_length, chunk_slots, chunk_targets
from ...policies import Registry
from ...protocol.models import Layout, TargetInfo

# (layout, size, gone, candidates, placed) → the new layout, or None: no candidate left
Replacement = Callable[[Layout, int, Collection[str], Sequence[TargetInfo], Mapping[str, int]],
                       Layout | None]
REPLACEMENTS: Registry[Replacement] = Registry("replacement")
NOTHING_PLACED: Mapping[str, int] = MappingProxyType({})


replacement = REPLACEMENTS.register


@dataclass(frozen=True)
class Copy:
    """Chunk ``index`` must be copied to ``dest`` from one of ``sources``."""

    index: int
    length: int
    dest: str
    sources: tuple[str, ...]


def with_slot(layout: Layout, slot: int, target: TargetInfo) -> Layout:
    targets = list(layout.targets)
    nodes = list(layout.nodes)
    targets[slot], nodes[slot] = target.id, target.node
    return replace(layout, targets=tuple(targets), nodes=tuple(nodes))


def _residues(layout: Layout, size: int) -> list[tuple[int, int]]:
    """(residue, chunks with ``index % stripe_count == residue``) for chunks that exist."""
    chunks = layout.chunk_count(size)
    n = layout.stripe_count
    return [(r, (chunks - r + n - 1) // n) for r in range(min(n, chunks))]


def replica_floor(layout: Layout, size: int) -> int:
    """The fewest replicas any chunk of the file gets under ``layout``."""
    counts = [len(chunk_slots(layout, r)) for r, _ in _residues(layout, size)]
    return min(counts) if counts else layout.replicas


def copy_count(old: Layout, new: Layout, size: int, gone: Collection[str]) -> int:
    """How many chunk copies moving from ``old`` to ``new`` takes."""
    total = 0
    for r, count in _residues(old, size):
        have = set(chunk_targets(old, r)) - set(gone)
        need = set(chunk_targets(new, r))
        total += count * len(need - have)
    return total


def copies_needed(old: Layout, new: Layout, size: int, gone: Collection[str]) -> list[Copy]:
    """Every chunk copy that makes ``new`` true.  Sources: the surviving ``old``
    copies, then those on gone targets (usable only while such a target still
    answers, as a removed one being drained does)."""
    out = []
    for index in range(old.chunk_count(size)):
        holders = chunk_targets(old, index)
        held = [t for t in holders if t not in gone]
        sources = tuple(held + [t for t in holders if t in gone])
        for dest in chunk_targets(new, index):
            if dest not in held:
                out.append(Copy(index, chunk_length(old.chunk_size, size, index), dest,
                                sources))
    return out


def copies_to(old: Layout, new: Layout, size: int, gone: Collection[str], dest: str) -> int:
    """How many chunk copies moving from ``old`` to ``new`` puts on ``dest``."""
    total = 0
    for r, count in _residues(old, size):
        have = set(chunk_targets(old, r)) - set(gone)
        if dest not in have and dest in chunk_targets(new, r):
            total += count
    return total


Score = Callable[[Layout, Layout, TargetInfo, dict[str, int]], float]


def _fill_slots(layout: Layout, size: int, gone: Collection[str],
                candidates: Sequence[TargetInfo], placed: Mapping[str, int],
                score: Score) -> Layout | None:
    """Each slot of a gone target, in order, gets the candidate that keeps the most
    replicas, then needs the fewest copies, then scores highest (``score(old, trial,
    candidate, placed)``, ``placed`` counting the slots filled before), then has the
    greatest id.  ``None`` when no candidate is left."""
    pool = [c for c in candidates if c.id not in gone]
    current = layout
    so_far = dict(placed)
    for slot, target in enumerate(layout.targets):
        if target not in gone:
            continue
        best: tuple[tuple[int, int, float, str], Layout, TargetInfo] | None = None
        for c in pool:
            trial = with_slot(current, slot, c)
            key = (min(replica_floor(trial, size), layout.replicas),
                   -copy_count(layout, trial, size, gone), score(layout, trial, c, so_far),
                   c.id)
            if best is None or key > best[0]:
                best = (key, trial, c)
        if best is None:
            return None
        _, trial, chosen = best
        so_far[chosen.id] = so_far.get(chosen.id, 0) + \
            copies_to(layout, trial, size, gone, chosen.id) * layout.chunk_size
        current = trial
    return current


def _free(t: TargetInfo) -> int:
    return max(t.capacity - t.used, 0)


@replacement("fewest_copies")
def fewest_copies(layout: Layout, size: int, gone: Collection[str],
                  candidates: Sequence[TargetInfo],
                  placed: Mapping[str, int] = NOTHING_PLACED) -> Layout | None:
    """Each slot of a gone target gets the candidate that keeps the most replicas,
    then needs the fewest copies, then has the most free space (as last heard: one
    file at a time, ``placed`` is not looked at).  ``None`` when no candidate is left."""
    return _fill_slots(layout, size, gone, candidates, placed,
                       lambda old, trial, c, so_far: _free(c))


@replacement("spread_by_free_space")
def spread_by_free_space(layout: Layout, size: int, gone: Collection[str],
                         candidates: Sequence[TargetInfo],
                         placed: Mapping[str, int] = NOTHING_PLACED) -> Layout | None:
    """As :func:`fewest_copies` (the most replicas, then the fewest copies), then the
    candidate this slot's copies would fill the least, counting what the round has
    already ``placed`` there: ``(placed + new bytes) / free space``.  Over a round,
    each target takes copies in proportion to its free space, never all of them
    the one that had the most when the round began."""
    def share(old: Layout, trial: Layout, c: TargetInfo, so_far: dict[str, int]) -> float:
        adds = copies_to(old, trial, size, gone, c.id) * old.chunk_size
        return -(so_far.get(c.id, 0) + adds) / max(_free(c), 1)

    return _fill_slots(layout, size, gone, candidates, placed, share)
