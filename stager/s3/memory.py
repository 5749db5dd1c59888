"""The gateway's process keeps the memory it frees for its next buffers (glibc).

Every request through the gateway makes and drops buffers of megabytes: a PUT's
body pieces (aiohttp joins what the socket gave into 4 MiB ``bytes``), a ranged
GET's chunk buffers (``bytearray(4 MiB)``, zero-filled).  glibc's malloc gives
such a block back to the kernel when it is freed at the top of the heap (past
``M_TRIM_THRESHOLD``) or when it was ``mmap``-ed (past a threshold it moves on its
own), so the next block of that size is new pages: a page fault and the kernel's
zeroing for every 4 KiB, about 0.9 CPU s per GiB on the 2-core build machine, as
much as MD5 costs a PUT.  Profiled (py-spy) during an s3fs GET, 37% of the
gateway's samples were the ``bytearray`` of the ranged read-on alone.

Fixed thresholds keep blocks below :data:`MMAP_THRESHOLD` on the heap and up to
:data:`TRIM_THRESHOLD` of freed heap in the process, so a buffer of the last
request is the next one's without the kernel.  The price is that much resident
memory the gateway keeps after a burst (its peak is not raised: what it keeps it
had).  Not glibc (musl, macOS): nothing to tune, nothing done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1       # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20   # blocks smaller than this come from the heap
TRIM_THRESHOLD = 128 << 20  # freed heap kept for the next buffers, at most

_done = False


def keep_freed_memory() -> bool:
    """Set the process's malloc thresholds (once); ``False`` where there is no glibc."""
    global _done
    if _done:
        return True
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        # gnu_get_libc_version is glibc's own: mallopt's parameters are glibc's
        mallopt, _ = libc.mallopt, libc.gnu_get_libc_version
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and \
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not ok:
        log.warning("mallopt refused the gateway's thresholds: buffers are new pages")
    _done = ok
    return ok
