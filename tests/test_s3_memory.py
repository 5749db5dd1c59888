"""The gateway's malloc thresholds (:mod:`stager.s3.memory`): a 4 MiB buffer freed
and made again is the same memory, not new pages faulted in each time."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import resource, sys
from stager.s3.memory import keep_freed_memory
if sys.argv[1] == "tuned":
    assert keep_freed_memory()
data = bytes(4 << 20)
for _ in range(4):                      # settle
    a, b = bytes(memoryview(data)), bytes(memoryview(data))
    del a, b
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(64):                     # as a request's pieces: two live, then freed
    a, b = bytes(memoryview(data)), bytes(memoryview(data))
    del a, b
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True,
                         text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_buffers_are_reused_not_faulted_in_again() -> None:
    tuned = faults("tuned")
    # 64 rounds of 8 MiB are 131,072 pages: the default faults most of them in again
    assert tuned < 2000, tuned
    assert faults("default") > 10 * max(tuned, 100)
