"""Machine-wide turns for test harnesses that cannot run twice at once.

A file lock (``flock``), held by a process for as long as it uses the shared thing:
the kernel releases it when the process dies, so a SIGKILLed pytest worker never
leaves it taken.  Only tests and benchmarks use these; the product's own exclusion
comes from the engines it runs on (PostgreSQL, Slurm).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Emulated nodes, network namespaces, per-job clusters and the test Slurms: modules
# and benchmarks that start them take turns (tests/test_jobcluster.py says what went
# wrong when they overlapped).  Held per test module (tests/conftest.py) and per
# benchmark (bench/runner.py, a module with ``EMULATES_NODES = True``).
NODES_LOCK = Path("/tmp/stager-nodes.lock")


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold ``path``'s exclusive lock (waiting for it) for the ``with`` block."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
