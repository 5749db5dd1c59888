"""The rebuild's placement policy (issue 26): over one round the copies spread over
the targets in proportion to their free space, counting what the round placed."""

from __future__ import annotations

from stager.layout import choose_layout
from stager.meta.upkeep.replan import REPLACEMENTS, copies_needed, spread_by_free_space
from stager.protocol.models import TargetInfo

CHUNK = 4096
GIB = 1 << 30


def target(i: int, free: int) -> TargetInfo:
    return TargetInfo(id=f"t{i}", node=f"node{i}", url=f"http://h{i}:1", capacity=4 * GIB,
                      used=4 * GIB - free)


def a_round(policy: str, targets: list[TargetInfo], lost: str, files: int) -> dict[str, int]:
    """Bytes each target receives when ``lost``'s files (two replicas over two targets,
    eight chunks each) are re-placed one after the other, as a rebuild pass does."""
    placed: dict[str, int] = {}
    live = [t for t in targets if t.id != lost]
    for start in range(files):
        layout = choose_layout(targets, chunk_size=CHUNK, stripe_count=2, replicas=2,
                               max_stripe_count=8, start=start)
        if lost not in layout.targets:
            continue
        new = REPLACEMENTS[policy](layout, 8 * CHUNK, {lost}, live, placed)
        assert new is not None and lost not in new.targets
        for c in copies_needed(layout, new, 8 * CHUNK, {lost}):
            placed[c.dest] = placed.get(c.dest, 0) + c.length
    return placed


def test_registered_and_the_rebuilds_default() -> None:
    from stager.meta.upkeep.rebuild import Rebuilder

    assert REPLACEMENTS["spread_by_free_space"] is spread_by_free_space
    assert Rebuilder.__init__.__defaults__ == ("spread_by_free_space",)


def test_equal_targets_share_a_round_evenly_where_the_old_policy_picked_one() -> None:
    targets = [target(i, 2 * GIB) for i in range(5)]
    targets[4] = target(4, 2 * GIB + 1)          # a byte more free: the old favourite
    spread = a_round("spread_by_free_space", targets, "t0", 200)
    total = sum(spread.values())
    assert total > 0 and set(spread) == {"t1", "t2", "t3", "t4"}
    assert max(spread.values()) <= total / 4 * 1.25, spread
    old = a_round("fewest_copies", targets, "t0", 200)
    assert max(old.values()) >= total / 2, old   # what issue 26 saw: most on one


def test_copies_follow_free_space() -> None:
    """t1 has three times the free space of the others: about three times the copies
    (less where a file's surviving replica is on t1, which then cannot take it)."""
    targets = [target(0, GIB), target(1, 3 * GIB), *(target(i, GIB) for i in range(2, 6))]
    placed = a_round("spread_by_free_space", targets, "t0", 600)
    others = [placed[f"t{i}"] for i in range(2, 6)]
    assert min(others) > 0 and placed["t1"] >= 2 * max(others), placed
