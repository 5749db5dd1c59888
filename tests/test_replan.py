"""Re-placement after a lost target: pure functions, checked exhaustively and by property."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stager.layout import choose_layout, chunk_targets
from stager.meta.upkeep.replan import (
    REPLACEMENTS,
    copies_needed,
    copy_count,
    fewest_copies,
    replica_floor,
)
from stager.protocol.models import Layout, TargetInfo

CHUNK = 4096


def targets(nodes: int, per_node: int = 1) -> list[TargetInfo]:
    return [TargetInfo(id=f"t{n}{k}", node=f"node{n}", url=f"http://h{n}{k}:1",
                       capacity=1 << 30)
            for n in range(nodes) for k in range(per_node)]


def layout_over(ts: list[TargetInfo], replicas: int) -> Layout:
    return choose_layout(ts, chunk_size=CHUNK, stripe_count=0, replicas=replicas,
                         max_stripe_count=8, start=0)


def test_registered_by_name() -> None:
    assert REPLACEMENTS["fewest_copies"] is fewest_copies


def test_a_fresh_node_takes_the_lost_slot_and_only_its_chunks_move() -> None:
    ts = targets(4)
    old = layout_over(ts[:3], 2)
    lost = old.targets[1]
    new = fewest_copies(old, 10 * CHUNK, {lost}, ts)
    assert new is not None and lost not in new.targets
    assert new.targets[1] == "t30" and new.targets[0] == old.targets[0]
    copies = copies_needed(old, new, 10 * CHUNK, {lost})
    # exactly the chunks that had a copy on the lost target, each copied once
    had = [i for i in range(10) if lost in chunk_targets(old, i)]
    assert sorted(c.index for c in copies) == had
    # surviving copies first; the lost target's own copy last (if it still answers)
    assert all(c.dest == "t30" and c.sources[-1] == lost and len(c.sources) == 2
               for c in copies)
    assert copy_count(old, new, 10 * CHUNK, {lost}) == len(copies)


def test_three_nodes_one_lost_reuses_a_target_to_stay_at_two_replicas() -> None:
    ts = targets(3)
    old = layout_over(ts, 2)
    lost = old.targets[2]
    live = [t for t in ts if t.id != lost]
    new = fewest_copies(old, 9 * CHUNK + 1, {lost}, live)
    assert new is not None and lost not in new.targets
    assert len(set(new.targets)) == 2                       # one target fills two slots
    for i in range(10):
        holders = chunk_targets(new, i)
        nodes = {new.nodes[new.targets.index(t)] for t in holders}
        assert len(holders) == 2 and len(nodes) == 2
    assert replica_floor(new, 9 * CHUNK + 1) == 2


def test_no_candidate_means_no_layout() -> None:
    ts = targets(2)
    old = layout_over(ts, 1)
    assert fewest_copies(old, CHUNK, {old.targets[0]}, []) is None


def test_copies_are_the_last_chunk_length() -> None:
    ts = targets(3)
    old = layout_over(ts, 2)
    lost = old.targets[0]
    size = 3 * CHUNK + 10
    new = fewest_copies(old, size, {lost}, [t for t in ts if t.id != lost])
    assert new is not None
    lengths = {c.index: c.length for c in copies_needed(old, new, size, {lost})}
    assert lengths.get(3, 10) == 10 and all(v == CHUNK for k, v in lengths.items() if k != 3)


@settings(max_examples=200, deadline=None)
@given(nodes=st.integers(2, 6), per_node=st.integers(1, 3), replicas=st.integers(1, 3),
       chunks=st.integers(0, 40), lost_slot=st.integers(0, 20), spare=st.booleans())
def test_property_every_chunk_keeps_the_most_replicas_it_can(
        nodes: int, per_node: int, replicas: int, chunks: int, lost_slot: int,
        spare: bool) -> None:
    ts = targets(nodes, per_node)
    replicas = min(replicas, nodes)
    old = layout_over(ts, replicas)
    lost = old.targets[lost_slot % old.stripe_count]
    candidates = [t for t in ts if t.id != lost]
    if spare:
        candidates.append(TargetInfo(id="spare", node="node-spare", url="http://s:1"))
    size = chunks * CHUNK
    new = fewest_copies(old, size, {lost}, candidates)
    assert new is not None and lost not in new.targets
    live_nodes = {t.node for t in candidates}
    for i in range(chunks):
        holders = chunk_targets(new, i)
        nodes_of = [new.nodes[new.targets.index(t)] for t in holders]
        assert len(set(nodes_of)) == len(nodes_of)              # distinct nodes
        assert len(holders) >= min(replicas, len(live_nodes), len(set(new.nodes)))
    # every copy goes where the new layout wants it, from a surviving old holder
    for c in copies_needed(old, new, size, {lost}):
        assert c.dest in chunk_targets(new, c.index)
        assert c.dest not in c.sources
        held = [t for t in chunk_targets(old, c.index) if t != lost]
        assert list(c.sources) == held + ([lost] if lost in chunk_targets(old, c.index) else [])
