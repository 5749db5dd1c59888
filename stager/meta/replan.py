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
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from ..layout import chunk_length, chunk_slots, chunk_targets
from ..policies import Registry
from ..protocol.models import Layout, TargetInfo

Replacement = Callable[[Layout, int, Collection[str], Sequence[TargetInfo]], Layout | None]
REPLACEMENTS: Registry[Replacement] = Registry("replacement")


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


@replacement("fewest_copies")
def fewest_copies(layout: Layout, size: int, gone: Collection[str],
                  candidates: Sequence[TargetInfo]) -> Layout | None:
    """Each slot of a gone target gets the candidate that keeps the most replicas,
    then needs the fewest copies, then has the most free space.  ``None`` when
    no candidate is left."""
    pool = [c for c in candidates if c.id not in gone]
    current = layout
    for slot, target in enumerate(layout.targets):
        if target not in gone:
            continue
        best: tuple[tuple[int, int, int, str], Layout] | None = None
        for c in pool:
            trial = with_slot(current, slot, c)
            key = (min(replica_floor(trial, size), layout.replicas),
                   -copy_count(layout, trial, size, gone), c.capacity - c.used, c.id)
            if best is None or key > best[0]:
                best = (key, trial)
        if best is None:
            return None
        current = best[1]
    return current
