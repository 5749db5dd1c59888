"""``python -m bench cache`` at its quick size: the trace comparison's figures (pure, fast).

The whole quick suite (tests/test_bench_quick.py) runs it as a user does; this
checks what its figures must say: every policy side by side in one run, plan-aware
eviction by the registered plan at the offline optimum, LRU fetching more.
"""

from __future__ import annotations

from bench import BENCHMARKS, bench_cache
from bench.runner import check_result
from bench.sim_eviction import compare, scenario


def test_cache_is_a_benchmark_with_every_policy_side_by_side() -> None:
    assert "cache" in BENCHMARKS
    result = check_result("cache", bench_cache.run(True))
    rows = {row[0]: dict(zip(result["columns"], row, strict=True)) for row in result["rows"]}
    assert sorted(rows) == sorted(f"{p} (simulated)" for p in ("lru", "s3fifo", "plan",
                                                                "belady"))
    plan, belady, lru = (rows[f"{p} (simulated)"] for p in ("plan", "belady", "lru"))
    assert plan["hit ratio"] >= 0.95 * belady["hit ratio"]
    assert plan["source requests"] < lru["source requests"]
    assert plan["epoch 2 source requests"] * 2 < lru["epoch 2 source requests"]
    assert result["aims"]["simulated: plan / belady, hit ratio"]["met"] is True
    assert any("Not measured yet" in note for note in result["notes"])


def test_the_scenario_is_the_issues_and_plan_fetches_each_chunk_once_in_epoch_one() -> None:
    s = scenario(96)
    assert 1.49 < s.nbytes / s.capacity < 1.51
    assert s.plan["world_size"] == 2 and s.plan["epochs"] == 2
    got = compare(s, ("plan", "lru"))
    # the first epoch reads every chunk; the plan keeps what epoch 1 reads again later
    assert got.first["plan"].misses == len(s.sizes)
    assert got.first["lru"].misses > len(s.sizes)     # chunks shared by two windows
    fetched_again = got.whole["plan"].misses - len(s.sizes)
    assert fetched_again <= len(s.sizes) - s.capacity // (4 << 20) + 1
