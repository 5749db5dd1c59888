"""A registered plan's reads by cached chunk (stager.plans.registered): pure, no servers.

The reference is the slow way: each epoch's order, each rank's batches, each
sample's extents cut into chunks, a chunk once per batch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from stager.errors import BadRequest
from stager.eviction import Uses, simulate
from stager.plans.accesses import SampleChunks, plan_accesses
from stager.plans.order import epoch_order, regular_blocks
from stager.plans.partition import PARTITIONS, cursor_after
from stager.plans.registered import (
    Dataset,
    Plan,
    plan_uses,
    registered_accesses,
    soonest,
)

FILES = ("f-a", "f-b", "f-c")
CHUNK_SIZES = (100, 64, 100)


def shards(samples: int = 400, seed: int = 3) -> Dataset:
    """Samples of 1-90 bytes laid end to end over three files (many cross a chunk
    boundary); every 7th has a second extent in file 2, every 50th is empty."""
    rng = np.random.default_rng(seed)
    size = rng.integers(1, 90, samples)
    size[::50] = 0
    file = np.arange(samples) * 2 // samples           # files 0 and 1, half each
    offset = np.zeros(samples, dtype=np.int64)
    for f in (0, 1):
        mine = file == f
        offset[mine] = np.cumsum(size[mine]) - size[mine]
    extra = np.arange(0, samples, 7)
    return Dataset(FILES, CHUNK_SIZES, samples,
                   sample=np.concatenate([np.arange(samples), extra]),
                   file=np.concatenate([file, np.full(len(extra), 2)]),
                   offset=np.concatenate([offset, extra * 13]),
                   length=np.concatenate([size, np.full(len(extra), 40)]))


def params(**over: Any) -> dict[str, Any]:
    plan = {"seed": 11, "epoch": 4, "epochs": 2, "world_size": 2, "batch_size": 8,
            "window": 48, "block": 6}
    plan.update(over)
    return plan


def reference(plan: dict[str, Any], data: Dataset) -> list[tuple[int, int, tuple[str, int]]]:
    """(step, rank, chunk) of every read, the slow way."""
    n, world, batch = data.samples, plan["world_size"], plan["batch_size"]
    extents: dict[int, list[tuple[int, int, int]]] = {}
    for s, f, o, ln in zip(data.sample.tolist(), data.file.tolist(), data.offset.tolist(),
                           data.length.tolist(), strict=True):
        extents.setdefault(s, []).append((f, o, ln))
    out = []
    step0 = 0
    for i, epoch in enumerate(range(plan["epoch"], plan["epoch"] + plan["epochs"])):
        order = epoch_order(plan.get("order", "window_of_blocks"), n,
                            regular_blocks(n, plan["block"]), plan["seed"], epoch,
                            plan["window"])
        cursor = plan.get("cursor", 0) if i == 0 else 0
        ranks = [PARTITIONS["interleaved"](n, cursor, world, r, batch, True)
                 for r in range(world)]
        steps = max(len(spans) for spans in ranks)
        for step in range(steps):
            for rank, spans in enumerate(ranks):
                if step >= len(spans):
                    continue
                seen: dict[tuple[str, int], None] = {}
                for sample in order[spans[step].start:spans[step].stop].tolist():
                    for f, o, ln in extents.get(sample, []):
                        size = CHUNK_SIZES[f]
                        for c in range(o // size, (o + ln - 1) // size + 1 if ln else 0):
                            seen[(FILES[f], c)] = None
                out.extend((step0 + step, rank, key) for key in seen)
        step0 += steps
    return out


def test_a_registered_plan_reads_what_the_slow_way_reads() -> None:
    data = shards()
    plan = params(cursor=64)
    accesses = registered_accesses(Plan.from_dict(plan, data.samples), data)
    got = [(s, r, data.name(k)) for s, r, k in zip(accesses.step.tolist(),
                                                   accesses.rank.tolist(),
                                                   accesses.key.tolist(), strict=True)]
    want = reference(plan, data)
    assert got == want
    # samples crossing chunks and second extents are in it: more reads than samples
    assert len({key for _, _, key in want}) > 12 and len(want) > 100
    assert {key[0] for _, _, key in want} == set(FILES)


def test_samples_of_one_chunk_each_read_as_plan_accesses_reads_them() -> None:
    chunk_of_sample = np.arange(600) // 10
    one = plan_accesses(chunk_of_sample, block_starts=regular_blocks(600, 10), batch_size=16,
                        world_size=3, epochs=(0, 1), window=80, seed=2)
    again = plan_accesses(SampleChunks.one_each(chunk_of_sample),
                          block_starts=regular_blocks(600, 10), batch_size=16,
                          world_size=3, epochs=(0, 1), window=80, seed=2)
    for a, b in ((one.key, again.key), (one.step, again.step), (one.rank, again.rank)):
        assert np.array_equal(a, b)


def test_next_use_is_the_first_step_at_or_after_now_that_reads_the_chunk() -> None:
    data = shards()
    plan = params()
    uses = plan_uses(plan, data)
    reads = reference(plan, data)
    last = reads[-1][0]
    keys = sorted({key for _, _, key in reads})
    for key in keys[::5]:
        steps = sorted({s for s, _, k in reads if k == key})
        for now in (0, steps[0], steps[0] + 1, steps[-1], steps[-1] + 1, last + 1):
            later = [s for s in steps if s >= now]
            assert uses(key, now) == (later[0] if later else math.inf), (key, now)
    assert uses(("f-a", 10_000), 0) == math.inf
    assert uses(("no-such-file", 0), 0) == math.inf
    # after rank 0's batch of a step, rank 1's of the same step is next: half a step on
    both = next((s, k) for s, r, k in reads if r == 1 and (s, 0, k) in set(reads))
    assert uses.after(both[1], both[0], 0) == both[0] + 0.5
    later = [s + r / 2 for s, r, k in reads if k == both[1] and s > both[0]]
    assert uses.after(both[1], both[0], 1) == (later[0] if later else math.inf)


def test_soonest_counts_steps_from_each_jobs_own_now() -> None:
    data = shards()
    a, b = plan_uses(params(seed=1), data), plan_uses(params(seed=2), data)
    key = data.name(int(a.accesses.key[0]))
    now_a, now_b = 5, 30
    want = min(a(key, now_a) - now_a, b(key, now_b) - now_b)
    assert soonest([(a, now_a), (b, now_b)], key) == want
    assert soonest([], key) == math.inf


def test_step_at_follows_the_cursor_a_job_reports() -> None:
    data = shards()
    plan = Plan.from_dict(params(cursor=32), data.samples)
    n, world, batch = data.samples, plan.world_size, plan.batch_size
    first = plan.steps(n, True)
    assert first == (n - 32) // (world * batch)
    for k in (0, 1, 7, first - 1):
        cursor = cursor_after(n, 32, world, batch, k, first)
        assert plan.step_at(n, plan.epoch, cursor) == k
    assert plan.step_at(n, plan.epoch + 1, 0) == first
    assert plan.step_at(n, plan.epoch + 1, 3 * world * batch) == first + 3
    assert plan.step_at(n, plan.epoch - 1, 100) == 0
    assert plan.step_at(n, plan.epoch + 5, 0) == first + plan.steps(n, False)
    assert plan.step_at(n, plan.epoch + 2, 64) == first + plan.steps(n, False)   # past the end


def test_plan_aware_eviction_by_a_registered_plan_matches_the_offline_optimum() -> None:
    data = shards(samples=600)
    plan = Plan.from_dict(params(), data.samples)
    accesses = registered_accesses(plan, data)
    trace = [data.name(k) for k in accesses.key.tolist()]
    table = plan_uses(plan, data)
    sizes = {key: 1 for key in trace}
    capacity = len(sizes) * 2 // 3
    # a read at position i is rank_of[i]'s batch of step step_of[i]
    step_of, rank_of = accesses.step.tolist(), accesses.rank.tolist()
    planned = simulate(trace, sizes, capacity, "plan",
                       next_use=lambda key, now: table.after(key, step_of[now], rank_of[now]))
    ints = accesses.key
    optimum = simulate(ints, {k: 1 for k in ints.tolist()}, capacity, "belady",
                       next_use=Uses(ints))
    lru = simulate(trace, sizes, capacity, "lru")
    # the plan's clock orders a batch's reads alike: ties the optimum's positions
    # break otherwise may cost a fetch or two
    first = len(sizes)                      # every chunk's first read misses
    assert planned.misses <= optimum.misses + 2
    assert lru.misses - first >= 2 * (planned.misses - first)


@pytest.mark.parametrize(("over", "field"), [
    ({"seed": None}, "seed"),
    ({"world_size": 0}, "world_size"),
    ({"batch_size": "8"}, "batch_size"),
    ({"window": True}, "window"),
    ({"order": "random"}, "order"),
    ({"partition": "blocked"}, "partition"),
    ({"epochs": 65}, "epochs"),
    ({"cursor": 10_000}, "cursor"),
    ({"drop_last": "yes"}, "drop_last"),
    ({"blocks": [0, 5, 5]}, "blocks"),
    ({"blocks": [1, 5]}, "blocks"),
    ({"blocks": "0,5"}, "blocks"),
    ({"block": 0}, "block"),
])
def test_a_bad_plan_is_a_bad_request_naming_its_field(over: dict[str, Any],
                                                      field: str) -> None:
    with pytest.raises(BadRequest, match=f"'{field}'") as caught:
        Plan.from_dict(params(**over), 400)
    assert caught.value.details.get("field") == field


def test_a_plan_that_is_not_an_object_or_extents_out_of_range_are_bad_requests() -> None:
    with pytest.raises(BadRequest, match="object"):
        Plan.from_dict([1, 2], 400)
    with pytest.raises(BadRequest, match="samples and files"):
        Dataset(FILES, CHUNK_SIZES, 10, sample=[0, 10], file=[0, 0], offset=[0, 0],
                length=[1, 1])
    with pytest.raises(BadRequest, match="chunk size"):
        Dataset(FILES, (100, 0, 100), 1, sample=[0], file=[0], offset=[0], length=[1])


def test_a_dataset_of_no_samples_or_empty_samples_is_read_by_no_plan() -> None:
    empty = Dataset(FILES, CHUNK_SIZES, 0, sample=[], file=[], offset=[], length=[])
    uses = plan_uses(params(), empty)
    assert len(uses.accesses) == 0 and uses(("f-a", 0), 0) == math.inf
    hollow = Dataset(FILES, CHUNK_SIZES, 64, sample=np.arange(64), file=np.zeros(64),
                     offset=np.arange(64), length=np.zeros(64))
    assert len(plan_uses(params(), hollow).accesses) == 0
