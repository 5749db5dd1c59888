"""Striping and placement: pure functions, registered by name.

*Placement* picks the ordered targets of a new file (once, at create time).
*Striping* maps a byte range of a file to chunk pieces and each chunk to the
targets that hold it.  Both sides compute chunk locations from the layout
alone, so reads need no per-chunk metadata round trip.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from .errors import NoTargets
from .policies import Registry
from .protocol.models import Layout, TargetInfo

PlacementPolicy = Callable[[Sequence[TargetInfo], int, int, int], list[TargetInfo]]
PLACEMENTS: Registry[PlacementPolicy] = Registry("placement")


placement = PLACEMENTS.register


@placement("spread")
def place_spread(targets: Sequence[TargetInfo], stripe_count: int, replicas: int,
                 start: int) -> list[TargetInfo]:
    """Interleave nodes so neighbouring stripe slots sit on different nodes.

    Targets are grouped by node; nodes are visited round-robin from a rotating
    ``start`` (so files begin on different nodes), and within a node the target
    with the most free space goes first.  Replica *j* of a chunk lands on the
    next slot of another node, so spreading nodes keeps replicas apart.
    """
    by_node: dict[str, list[TargetInfo]] = {}
    for t in sorted(targets, key=lambda t: (t.node, -(t.capacity - t.used), t.id)):
        by_node.setdefault(t.node, []).append(t)
    nodes = sorted(by_node)
    if not nodes:
        raise NoTargets("no healthy storage targets")
    k = start % len(nodes)
    nodes = nodes[k:] + nodes[:k]
    order: list[TargetInfo] = []
    depth = 0
    while len(order) < min(stripe_count, len(targets)):     # the rest would be cut off
        for node in nodes:
            group = by_node[node]
            if depth < len(group):
                order.append(group[(depth + start // len(nodes)) % len(group)])
        depth += 1
    return order[:stripe_count]


# The states a new layout may name: up, and suspect (avoided while enough are up).
PLACEABLE = frozenset({"up", "suspect"})


def choose_layout(targets: Sequence[TargetInfo], *, chunk_size: int, stripe_count: int,
                  replicas: int, max_stripe_count: int, start: int,
                  policy: str = "spread") -> Layout:
    """The layout of a new file over ``targets``: over the up ones; where they cannot
    give it ``stripe_count`` targets on ``replicas`` nodes, over them and as few suspect
    ones as that takes, a node at a time (a suspect target still heartbeats: it is
    avoided, never a reason for a write to fail).  Targets in other states, never."""
    pool = [t for t in targets if t.up]
    spare = _by_node([t for t in targets if t.state == "suspect"], start)
    while True:
        try:
            return _place(pool, chunk_size=chunk_size, stripe_count=stripe_count,
                          replicas=replicas, max_stripe_count=max_stripe_count,
                          start=start, policy=policy)
        except NoTargets:
            if not spare:
                raise
            pool = pool + spare.pop(0)


def _by_node(targets: Sequence[TargetInfo], start: int) -> list[list[TargetInfo]]:
    """``targets`` grouped by node, the nodes in an order rotated by ``start`` (so
    that files fall back on different ones)."""
    groups: dict[str, list[TargetInfo]] = {}
    for t in sorted(targets, key=lambda t: (t.node, t.id)):
        groups.setdefault(t.node, []).append(t)
    nodes = sorted(groups)
    k = start % len(nodes) if nodes else 0
    return [groups[n] for n in nodes[k:] + nodes[:k]]


def _place(up: Sequence[TargetInfo], *, chunk_size: int, stripe_count: int, replicas: int,
           max_stripe_count: int, start: int, policy: str) -> Layout:
    if not up:
        raise NoTargets("no healthy storage targets")
    want = stripe_count or min(len(up), max_stripe_count)
    if want > len(up):
        raise NoTargets(f"stripe_count {want} asks for more than the {len(up)} healthy targets",
                        healthy=len(up), wanted=want)
    chosen = PLACEMENTS[policy](up, want, replicas, start)
    nodes = {t.node for t in chosen}
    if replicas > len(nodes):
        raise NoTargets(f"{replicas} replicas need {replicas} distinct nodes among the stripe "
                        f"targets; only {len(nodes)} available",
                        nodes=len(nodes), replicas=replicas)
    return Layout(chunk_size=chunk_size, stripe_count=len(chosen), replicas=replicas,
                  targets=tuple(t.id for t in chosen), nodes=tuple(t.node for t in chosen))


def chunk_slots(layout: Layout, index: int) -> list[int]:
    """Slots (indices into ``layout.targets``) holding chunk ``index``, primary first.

    The primary is slot ``index % stripe_count``; each further replica is the
    next slot in cyclic order whose node is not yet used.
    """
    n = layout.stripe_count
    first = index % n
    slots = [first]
    used = {layout.nodes[first]}
    for step in range(1, n):
        if len(slots) == layout.replicas:
            break
        slot = (first + step) % n
        if layout.nodes[slot] not in used:
            slots.append(slot)
            used.add(layout.nodes[slot])
    return slots


def chunk_targets(layout: Layout, index: int) -> list[str]:
    """Target ids holding chunk ``index``, primary first."""
    return [layout.targets[s] for s in chunk_slots(layout, index)]


@dataclass(frozen=True)
class Piece:
    """``length`` bytes of chunk ``index`` at ``offset``, landing at ``file_offset``."""

    index: int
    offset: int
    length: int
    file_offset: int


def pieces(chunk_size: int, size: int, start: int, stop: int) -> Iterator[Piece]:
    """Split the byte range ``[start, stop)`` of a ``size``-byte file into chunk pieces."""
    stop = min(stop, size)
    pos = max(start, 0)
    while pos < stop:
        index, offset = divmod(pos, chunk_size)
        length = min(chunk_size - offset, stop - pos)
        yield Piece(index, offset, length, pos)
        pos += length


def chunk_length(chunk_size: int, size: int, index: int) -> int:
    """Bytes in chunk ``index`` of a ``size``-byte file."""
    return max(0, min(chunk_size, size - index * chunk_size))
