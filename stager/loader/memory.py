"""Freed memory kept for reuse: the prefetch window cycles through malloc.

Each small sample is a ``bytes`` object of its own (16 KiB, say), made on the
I/O thread and freed by the consumer a few batches later, so the prefetch
window frees and refills up to its whole bound over and over.  glibc's malloc
gives memory at the top of a heap back to the kernel as soon as more than
``M_TRIM_THRESHOLD`` (128 KiB to start with) of it is free, and the next
batches fault fresh zeroed pages in again: 0.6-1.2 page faults per 16 KiB
sample, and a sixth of the client's CPU in the loader benchmark (``python
-m bench.profile_small loader`` prints the faults per sample; figures in
bench/NOTES.md).

Samples of 128 KiB or more fared worse: malloc maps each one on its own
(``M_MMAP_THRESHOLD``) and unmaps it when freed, so a 1 MiB sample faulted in
its 256 pages every time.

:func:`keep_freed_memory` raises the trim threshold to twice the loader's
prefetch bound, and the mmap threshold to the most glibc's own dynamic one
would rise to (32 MiB on 64-bit machines): samples up to that size come from
the heap, memory the window freed stays mapped for the next batches, and each
of the process's malloc arenas holds at most that much more than it uses.  The
cost: a process's resident memory stays near its peak, and large allocations
of its own (up to 32 MiB) come from the heap too.  It changes malloc for the
whole process (it is where the samples live) and is never lowered again; the
config key ``loader_keep_freed`` (``STAGER_LOADER_KEEP_FREED=0``) leaves malloc
alone.  Only glibc has the knob; elsewhere nothing changes.
"""

from __future__ import annotations

import ctypes
import os
import threading

M_TRIM_THRESHOLD = -1           # mallopt's parameter numbers (glibc's malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_MAX = 4 * 1024 * 1024 * ctypes.sizeof(ctypes.c_long)   # DEFAULT_MMAP_THRESHOLD_MAX
_INT_MAX = 2**31 - 1

_lock = threading.Lock()
_kept = 0                       # the threshold this process set (0: none)


def glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError):
        return False


def keep_freed_memory(nbytes: int) -> int:
    """Have malloc keep up to ``nbytes`` of freed memory per heap (never less than
    an earlier call asked for).  Returns the threshold now set; 0 where the C
    library is not glibc or refused it."""
    global _kept
    want = min(max(nbytes, 0), _INT_MAX)
    with _lock:
        if _kept >= want or not glibc():
            return _kept
        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError):
            return _kept
        mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        mallopt.restype = ctypes.c_int
        if mallopt(M_TRIM_THRESHOLD, want) == 1:
            if not _kept:
                mallopt(M_MMAP_THRESHOLD, MMAP_MAX)
            _kept = want
        return _kept


def kept() -> int:
    """The threshold :func:`keep_freed_memory` set in this process (0: none)."""
    return _kept
