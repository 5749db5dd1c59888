"""Eviction policies and the trace simulator (pure: no servers).

The traces are the ones a training cache sees: random reads, cyclic passes
and shuffled epochs derived from a Loader plan, plus a hot set drowned in
one-hit wonders.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from stager.eviction import EVICTION, FurthestNextUse, Uses, simulate
from stager.plans.accesses import plan_accesses
from stager.plans.order import epoch_order, regular_blocks
from stager.plans.partition import PARTITIONS
from stager.policies import REGISTRIES

PAST = ("lru", "s3fifo")


def random_trace(keys: int = 300, length: int = 6000, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.zipf(1.3, length) % keys


def cyclic_trace(keys: int, laps: int) -> np.ndarray:
    return np.tile(np.arange(keys), laps)


def shuffled_epochs(keys: int = 200, epochs: int = 4, seed: int = 2) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.permutation(keys) for _ in range(epochs)])


def loader_plan(samples: int = 3000, per_chunk: int = 10, world: int = 2, batch: int = 16,
                epochs: tuple[int, ...] = (0, 1), window: int = 80, seed: int = 5
                ) -> dict[str, Any]:
    return {"chunk_of_sample": np.arange(samples) // per_chunk,
            "block_starts": regular_blocks(samples, per_chunk), "batch_size": batch,
            "world_size": world, "epochs": epochs, "window": window, "seed": seed}


TRACES = {
    "random": random_trace(),
    "cyclic": cyclic_trace(120, 8),
    "shuffled epochs": shuffled_epochs(),
    "loader plan": plan_accesses(**loader_plan()).key,
}


def run(trace: np.ndarray, capacity: int, policy: str, **kw: Any) -> Any:
    sizes = np.ones(int(trace.max()) + 1, dtype=np.int64)
    uses = Uses(trace) if policy in ("plan", "belady") else None
    return simulate(trace, sizes, capacity, policy, next_use=uses, **kw)


def test_the_registry_lists_every_policy() -> None:
    assert REGISTRIES["eviction"] is EVICTION
    assert sorted(EVICTION) == ["belady", "lru", "plan", "s3fifo"]
    with pytest.raises(ValueError, match="unknown eviction policy 'mru'"):
        EVICTION["mru"]
    with pytest.raises(ValueError, match="needs next_use"):
        EVICTION["plan"](10, None)


@pytest.mark.parametrize("name", list(TRACES))
def test_belady_hits_at_least_as_often_as_every_other_policy(name: str) -> None:
    trace = TRACES[name]
    capacity = len(np.unique(trace)) * 2 // 3
    best = run(trace, capacity, "belady")
    for policy in PAST:
        assert best.hits >= run(trace, capacity, policy).hits, policy
    assert best.hits > run(trace, capacity, "lru").hits
    assert best.hits + best.misses == len(trace)


def test_lru_never_hits_a_cycle_one_longer_than_the_cache_and_plan_keeps_all_but_one(
        ) -> None:
    capacity, laps = 10, 30
    # a sequential plan, one sample per chunk, one rank: the cycle 0 … capacity, again
    accesses = plan_accesses(np.arange(capacity + 1), block_starts=np.arange(capacity + 1),
                             batch_size=1, world_size=1, epochs=range(laps), window=1,
                             order="sequential")
    trace = accesses.key
    assert trace.tolist() == cyclic_trace(capacity + 1, laps).tolist()
    sizes = np.ones(capacity + 1, dtype=np.int64)
    lru = simulate(trace, sizes, capacity, "lru")
    planned = simulate(trace, sizes, capacity, "plan", next_use=accesses.uses())
    assert lru.hits == 0
    after_first_lap = len(trace) - (capacity + 1)
    # one miss per `capacity` accesses once the cache is full
    assert planned.hits >= after_first_lap * (capacity - 1) / capacity
    assert planned.misses <= capacity + 1 + math.ceil(after_first_lap / capacity)


def reference_trace(plan: dict[str, Any]) -> list[int]:
    """The plan's chunk reads, step by step and rank by rank, the slow way."""
    chunks, world = plan["chunk_of_sample"], plan["world_size"]
    n = len(chunks)
    out: list[int] = []
    for epoch in plan["epochs"]:
        order = epoch_order("window_of_blocks", n, plan["block_starts"], plan["seed"],
                            epoch, plan["window"])
        ranks = [PARTITIONS["interleaved"](n, 0, world, r, plan["batch_size"], True)
                 for r in range(world)]
        for step in range(max(len(spans) for spans in ranks)):
            for spans in ranks:
                if step < len(spans):
                    span = spans[step]
                    batch = chunks[order[span.start:span.stop]].tolist()
                    out.extend(dict.fromkeys(batch))        # each chunk once a batch
    return out


def test_plan_given_the_true_plan_equals_belady() -> None:
    plan = loader_plan()
    accesses = plan_accesses(**plan)
    trace = reference_trace(plan)
    assert accesses.key.tolist() == trace
    steps = np.diff(accesses.step)
    assert np.all(steps >= 0) and accesses.step[-1] == 2 * (3000 // 32) - 1
    sizes = np.ones(300, dtype=np.int64)
    planned = simulate(accesses.key, sizes, 200, "plan", next_use=accesses.uses())
    best = simulate(np.array(trace), sizes, 200, "belady", next_use=Uses(trace))
    assert (planned.hits, planned.victims) == (best.hits, best.victims)
    assert planned.hits > simulate(accesses.key, sizes, 200, "lru").hits


def test_plan_accesses_of_100_000_samples_cover_every_chunk_each_epoch() -> None:
    plan = loader_plan(samples=100_000, per_chunk=40, world=4, batch=64, epochs=(3, 4),
                       window=320)
    accesses = plan_accesses(**plan, drop_last=False)
    first = accesses.step < accesses.step.max() // 2 + 1
    for epoch_keys in (accesses.key[first], accesses.key[~first]):
        assert np.array_equal(np.unique(epoch_keys), np.arange(2500))
    assert set(np.unique(accesses.rank).tolist()) == {0, 1, 2, 3}


def test_s3fifo_beats_lru_when_a_hot_set_is_drowned_in_one_hit_wonders() -> None:
    rng = np.random.default_rng(3)
    hot = rng.integers(0, 50, 20_000)
    one_hit = np.arange(50, 50 + 20_000)          # each read once, never again
    trace = np.where(rng.random(20_000) < 0.5, hot, one_hit)
    lru, s3 = run(trace, 60, "lru"), run(trace, 60, "s3fifo")
    assert s3.hits > 1.3 * lru.hits


def test_s3fifo_moves_a_key_read_again_while_new_to_the_main_queue() -> None:
    trace = np.array([100, 100, *range(30), 100])      # read twice, 30 others, again
    sizes = {key: 1 for key in trace.tolist()}
    s3 = simulate(trace, sizes, 10, "s3fifo")
    assert 100 not in s3.victims and s3.hits == 2
    assert simulate(trace, sizes, 10, "lru").hits == 1


def drive(policy: str, trace: np.ndarray, sizes: np.ndarray, capacity: int,
          pinned: frozenset[int]) -> list[int]:
    """Replays ``trace`` against a policy's own calls, checking each answer."""
    state = EVICTION[policy](capacity, Uses(trace))
    cached: dict[int, int] = {}
    evicted: list[int] = []
    for now, key in enumerate(trace.tolist()):
        size = int(sizes[key])
        if key in cached:
            state.hit(key, now)
            continue
        need = sum(cached.values()) + size - capacity
        if need > 0:
            victims = state.victims(need, now, pinned)
            assert len(set(victims)) == len(victims)
            assert set(victims) <= set(cached) and not set(victims) & pinned
            evictable = sum(s for k, s in cached.items() if k not in pinned)
            freed = sum(cached[v] for v in victims)
            assert freed >= min(need, evictable)     # room whenever there can be
            for victim in victims:
                del cached[victim]
            evicted.extend(victims)
            if freed < need:
                continue                            # only pins left: served, not kept
        cached[key] = size
        state.admit(key, size, now)
    return evicted


@pytest.mark.parametrize("policy", sorted(EVICTION))
def test_capacity_holds_victims_free_enough_and_pins_stay(policy: str) -> None:
    trace = np.concatenate([random_trace(keys=200, length=3000), shuffled_epochs(200, 3)])
    sizes = np.random.default_rng(4).integers(1, 9, 200)
    pinned = frozenset(range(0, 200, 17))
    evicted = drive(policy, trace, sizes, 300, pinned)
    assert evicted and not set(evicted) & pinned
    result = simulate(trace, sizes, 300, policy, next_use=Uses(trace), pinned=pinned)
    assert result.victims == evicted


def test_furthest_next_use_drops_never_again_first_then_furthest_ties_by_key() -> None:
    nexts = {5: math.inf, 2: 50.0, 3: math.inf, 4: 10.0, 1: 50.0}
    state = FurthestNextUse(lambda key, now: nexts[key])
    for key in nexts:
        state.admit(key, 1, 0)
    assert [state.victims(1, 1, frozenset()) for _ in nexts] == [[3], [5], [1], [2], [4]]


def test_uses_answer_the_first_use_after_now() -> None:
    uses = Uses([7, 8, 7, 7], [3, 4, 9, 12])
    assert [uses(7, t) for t in (0, 3, 9, 12)] == [3, 9, 12, math.inf]
    assert uses(9, 0) == math.inf
    assert Uses([])(7, 0) == math.inf           # a plan of no reads


@pytest.mark.parametrize("policy", sorted(EVICTION))
def test_the_same_trace_gives_the_same_victims(policy: str) -> None:
    trace = TRACES["loader plan"]
    first, again = run(trace, 150, policy), run(trace, 150, policy)
    assert first.victims and first.victims == again.victims
    assert first.evictions == len(first.victims)
