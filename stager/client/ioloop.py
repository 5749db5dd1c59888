"""The I/O thread of the blocking APIs: one event loop per process, on its own thread.

``Client``, ``Loader`` (its prefetching and telemetry) and the ``stager://``
filesystem run their coroutines there, as fsspec's backends run on fsspec's IO
thread.  The loop is uvloop's when config ``event_loop`` is ``"auto"`` (the
default) and uvloop is installed: a Loader spends less CPU per sample on it
(bench/RESULTS.md, "Loader on uvloop").  The first caller in a process chooses
the kind; later callers share that loop.

After ``fork`` (PyTorch DataLoader workers) the parent's thread does not exist
in the child, so the child starts a loop of its own on first use.  The
parent's loop object is kept, untouched, in the child: closing or collecting a
loop that is running in another process's image would act on the parent's
epoll set.
"""

from __future__ import annotations

import asyncio
import os
import threading

from ..aio import loop_factory

THREAD_NAME = "stager-io"

_lock = threading.Lock()
_loop: list[asyncio.AbstractEventLoop | None] = [None]
_INHERITED: list[asyncio.AbstractEventLoop] = []    # a forked child's parent loop


def io_loop(kind: str = "auto") -> asyncio.AbstractEventLoop:
    """This process's I/O loop, started on first use (``kind``: config ``event_loop``)."""
    loop = _loop[0]
    if loop is not None:
        return loop
    with _lock:
        if _loop[0] is None:
            new = (loop_factory(kind) or asyncio.new_event_loop)()
            threading.Thread(target=new.run_forever, name=THREAD_NAME, daemon=True).start()
            _loop[0] = new
        return _loop[0]


def _forget_parent_loop() -> None:
    global _lock
    if _loop[0] is not None:
        _INHERITED.append(_loop[0])
    _loop[0] = None
    _lock = threading.Lock()    # the parent's I/O thread may have held it at fork


os.register_at_fork(after_in_child=_forget_parent_loop)
