"""Chunk buffers for the mount's read path: huge-page backed, and reused.

Every byte a reader gets through the mount is copied twice by the daemon's
process: by ``recv`` from a data server's socket into a chunk buffer, and by
the reply to the kernel from that buffer into the page cache (the kernel pins
and copies the buffer 4 KiB page by page).  Measured with
``python -m bench.profile_mount --compare ...`` (two mounts read in turn in
one run, 1 GiB file, 4 loopback data servers, 2 cores), in the daemon's CPU
seconds per GB:

* buffers on 4 KiB pages (``bytearray``) against buffers that start on a huge
  page boundary and are marked ``MADV_HUGEPAGE``: 0.60 against 0.37.  With
  small pages the copies miss the TLB once per page (dearer still in a VM),
  and the reply's ``memcpy`` was a quarter of the daemon's CPU (perf);
* a fresh buffer costs a page fault per page before the network can write into
  it; with buffers kept per open file only, every open started with fresh ones:
  0.44 against 0.42 with one :class:`BufferPool` per mount (more on small files).
"""

from __future__ import annotations

import asyncio
import mmap
import time
from pathlib import Path
from typing import Any

import numpy as np

MiB = 1 << 20
IDLE_TRIM = 30.0         # seconds the pool keeps buffers after the last one was taken

# A chunk buffer: a numpy view, so that every memoryview of it holds a reference to
# it and ``sys.getrefcount`` tells whether one is still alive (a memoryview of a
# memoryview does not reference its parent).
Buffer = np.ndarray[Any, np.dtype[np.uint8]]


def _huge_page_size() -> int:
    try:
        return int(Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return 2 * MiB


HUGE_PAGE = _huge_page_size()


def allocate(length: int) -> Buffer:
    """``length`` bytes of fresh anonymous memory, starting on a huge page boundary
    and marked ``MADV_HUGEPAGE`` (transparent huge pages in "madvise" mode, the
    usual default, use them then).  The slack before and after is never touched,
    so never resident; the mapping goes when the last view of it does.  Faulting
    huge pages in may compact memory first; the pool makes that rare."""
    if length < HUGE_PAGE:       # a small file, or a file's last chunk: plain malloc
        return np.empty(length, np.uint8)
    region = _anonymous(length + HUGE_PAGE)
    whole = np.frombuffer(region, np.uint8)
    skip = -whole.ctypes.data % HUGE_PAGE
    try:
        region.madvise(mmap.MADV_HUGEPAGE, skip, length)
    except (AttributeError, OSError):     # no THP in this kernel: small pages, still fine
        pass
    return whole[skip:skip + length]


def _anonymous(length: int) -> mmap.mmap:
    # Private: shared anonymous memory is shmem, whose huge pages are off by default.
    return mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


class BufferPool:
    """Chunk buffers to fill again, shared by every open file of one mount.

    Buffers go back only when nothing refers to them any more (the caller checks),
    at most ``max_bytes`` of them, and are let go once none was taken for
    ``IDLE_TRIM`` seconds, so an idle mount holds no chunk memory.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.allocated = 0           # buffers made new (the rest came from the pool)
        self._free: dict[int, list[Buffer]] = {}
        self._bytes = 0
        self._taken_at = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def nbytes(self) -> int:
        """Bytes held for reuse now."""
        return self._bytes

    def take(self, length: int) -> Buffer:
        self._taken_at = time.monotonic()
        free = self._free.get(length)
        if free:
            self._bytes -= length
            return free.pop()
        self.allocated += 1
        return allocate(length)

    def give(self, buf: Buffer) -> None:
        """Keep ``buf`` for a later :meth:`take`; nothing may refer to it any more."""
        if self._bytes + len(buf) > self.max_bytes:
            return
        self._free.setdefault(len(buf), []).append(buf)
        self._bytes += len(buf)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(IDLE_TRIM, self._trim)

    def _trim(self) -> None:
        self._timer = None
        idle = time.monotonic() - self._taken_at
        if idle >= IDLE_TRIM:
            self.clear()
        elif self._bytes:
            self._timer = asyncio.get_running_loop().call_later(IDLE_TRIM - idle, self._trim)

    def clear(self) -> None:
        self._free.clear()
        self._bytes = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
