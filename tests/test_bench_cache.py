"""``python -m bench cache`` at its quick size: what its figures must say.

The whole quick suite (tests/test_bench_quick.py) runs it as a user does; this
checks each part.  The trace comparison (pure, fast): every policy side by side,
plan-aware eviction by the registered plan at the offline optimum, LRU fetching
more.  The cluster parts (real ``stager up`` clusters, a real HTTP source that
counts what it is asked, on loopback at this size): one source request per chunk
in a first epoch, none in a cached second epoch, every policy's run byte-exact
under the limit.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from bench import BENCHMARKS, bench_cache
from bench.cache_source import CountingSource, ranged_bytes
from bench.runner import check_result
from bench.sim_eviction import compare, scenario


def _rows(part: dict) -> dict[str, dict[str, object]]:
    return {row[0]: dict(zip(bench_cache.COLUMNS, row, strict=True)) for row in part["rows"]}


def test_cache_is_a_benchmark_with_every_policy_side_by_side() -> None:
    assert "cache" in BENCHMARKS
    part = bench_cache.trace_comparison(True)
    rows = _rows(part)
    assert sorted(rows) == sorted(f"{p} (simulated)" for p in ("lru", "s3fifo", "plan",
                                                                "belady"))
    plan, belady, lru = (rows[f"{p} (simulated)"] for p in ("plan", "belady", "lru"))
    assert plan["hit ratio"] >= 0.95 * belady["hit ratio"]
    assert plan["source requests"] < lru["source requests"]
    assert plan["epoch 2 source requests"] * 2 < lru["epoch 2 source requests"]
    assert part["aims"]["simulated: plan / belady, hit ratio"]["met"] is True
    assert all(row["samples/s"] == "" for row in rows.values())     # not this part's


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


def test_the_source_counts_file_requests_by_method(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.bin").write_bytes(bytes(range(256)) * 40)     # 10240 bytes
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with CountingSource(tmp_path) as source:
        ranged = urllib.request.Request(f"{source.url}/d/a.bin",
                                        headers={"Range": "bytes=100-1123"})
        assert direct.open(ranged).read() == (bytes(range(256)) * 40)[100:1124]
        assert direct.open(urllib.request.Request(f"{source.url}/d/a.bin",
                                                  method="HEAD")).status == 200
        assert b"a.bin" in direct.open(f"{source.url}/d/").read()
        source.counts()                                 # a look is not counted
        got = source.counts()
    assert got == {"GET": 1, "ranged GET": 1, "ranged bytes": 1024, "HEAD": 1,
                   "listing": 1}
    assert json.loads(json.dumps(got)) == got


def test_ranged_bytes_are_bounded_by_the_file() -> None:
    assert ranged_bytes("bytes=0-1023", 4096) == 1024
    assert ranged_bytes("bytes=4000-8191", 4096) == 96
    assert ranged_bytes("bytes=100-", 4096) == 3996
    assert ranged_bytes("items=1-2", 4096) == 0


def check_quick_cluster_rows(result: dict) -> None:
    """What the quick run's cluster parts must say (tests/test_bench_quick.py calls this
    on the quick suite's cache.json: the cluster runs are not run twice)."""
    rows = _rows(result)

    def one(start: str) -> dict[str, object]:
        [row] = [r for name, r in rows.items() if name.startswith(start)]
        return row

    # the attached epochs: one request per chunk in the first, none when cached
    first = one("cluster: attached, epoch 1")
    second = one("cluster: attached, epoch 2 by the job's Loader")
    fresh = one("cluster: attached, epoch 2 by a fresh Loader")
    paced = one("cluster: attached, epoch 2 again paced")
    assert first["source requests"] == 24               # one 1 MiB file, one chunk, each
    for row in (second, fresh):
        assert row["source requests"] == 0 and row["hit ratio"] == 1.0
    assert paced["source requests"] == 0 and isinstance(paced["stall %"], float)
    for name, row in rows.items():
        if name.startswith("cluster: "):
            assert isinstance(row["MB/s"], float) and row["MB/s"] > 0
    assert "cluster: attached epoch 2 / staged epoch 2, samples/s" in result["ratios"]
    assert "cluster: attached epoch 2, learnt / fresh Loader, samples/s" in result["ratios"]
    assert not any("line rate" in k for k in result["aims"])     # uncapped at this size
    assert any("capped source is skipped" in n for n in result["notes"])
    # every policy on a cluster, 96 one-chunk files 1.5x the limit: each fetched once in
    # the first epoch, some again in the second
    policies = bench_cache.cluster_policy_names()
    optimum, low = (bench_cache.OPTIMUM_FULL.format(policy=policies[0]),
                    bench_cache.OPTIMUM_LOW.format(policy=policies[0]))
    on_cluster = {n: r for n, r in rows.items()
                  if n.endswith("(cluster)") or n in (optimum, low)}
    assert sorted(on_cluster) == sorted([f"{p} (cluster)" for p in policies] + [optimum, low])
    for row in on_cluster.values():
        assert row["source requests"] > 96 and row["epoch 2 source requests"] > 0
        assert 0 < row["hit ratio"] < 1
    # even the optimum keeps at most 64 of the 96 files (the limit) for the second epoch,
    # and at the low watermark fewer
    assert rows[optimum]["epoch 2 source requests"] >= 32
    assert rows[low]["epoch 2 source requests"] > rows[optimum]["epoch 2 source requests"]
    assert "cluster: plan / belady at the full limit, hit ratio" in result["ratios"] or \
        "plan" not in policies


def test_the_result_has_every_part_in_the_columns() -> None:
    parts = [bench_cache.trace_comparison(True)]
    result = {"title": "t", "columns": bench_cache.COLUMNS,
              "rows": [r for p in parts for r in p["rows"]]}
    assert check_result("cache", result) is result
    assert bench_cache.PARTS[0] is bench_cache.trace_comparison
    assert {bench_cache.cluster_epochs, bench_cache.cluster_policies} <= set(bench_cache.PARTS)
