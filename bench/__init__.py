"""stager's benchmarks: ``python -m bench [NAME…] [--quick] [--out DIR]``.

Each benchmark is named in :data:`BENCHMARKS` and lives in a module
``bench/bench_<name>.py`` with ``run(quick: bool) -> dict`` returning::

    {"title": str, "command": str, "columns": [str], "rows": [[...]],
     "ratios": {name: float}, "aims": {name: {"value": float, "aim": str, "met": bool}},
     "notes": [str],
     "plot": {"kind": "bar" | "line", "x": column, "y": [column, ...],   # optional
              "ylabel": str, "logy": bool}}

The runner (:mod:`bench.runner`) adds the machine's facts and writes
``results/<name>.json``; :mod:`bench.report` renders ``RESULTS.md`` and one PNG
per benchmark from every result file present.  Baselines are measured side by
side with stager in the same run, so the ratios hold even on a busy machine.
"""

# The benchmarks, in the order they run and appear in RESULTS.md.  Named here, not
# found by file name: a helper module (``bench_metadata_pg.py``, the store rows of
# ``metadata``) is never taken for a benchmark.
BENCHMARKS = ("striping", "loopback", "small_samples", "metadata", "writes", "write_failover",
              "memory", "auth", "jobcluster", "jobstart", "loader", "mount", "stage",
              "cache", "floors", "s3")
BENCHMARKS = BENCHMARKS + ("scale",)    # heartbeats and telemetry per 1,000 nodes (issue 30)
BENCHMARKS = BENCHMARKS + ("mosaic",)   # Mosaic Streaming beside the Loader (issues 29, 30)
# Those that start emulated nodes, network namespaces or per-job clusters: each runs in
# its turn of stager.testing.locks.NODES_LOCK, as the test modules that do so take
# theirs, so the quick run of every benchmark may share the machine with those modules.
EMULATE_NODES = frozenset({"striping", "jobcluster", "stage", "cache"})
