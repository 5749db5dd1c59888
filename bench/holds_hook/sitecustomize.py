"""Loaded into a metadata server by ``python -m bench.profile_holds`` (through PYTHONPATH):
the thread CPU of every callback its asyncio loop runs, by kind (a request's handler by
its route's first path segment), and of every garbage collection, by generation.

A stat waits for whatever callback holds the loop when it arrives; these are those
holds.  Thread CPU, not wall time: on a busy machine the wall time of a callback is
mostly waiting for a core.  Written every 2 s to ``$STAGER_HOLDS.PID.json``; a file
``$STAGER_HOLDS.reset`` empties the record (the load's warm-up is left out).
"""

from __future__ import annotations

import os
import sys

if os.environ.get("STAGER_HOLDS") and "meta" in sys.argv:
    import asyncio.events
    import collections
    import gc
    import json
    import threading
    import time
    from typing import Any

    _record: dict[str, list[float]] = collections.defaultdict(list)
    _run = asyncio.events.Handle._run

    def _kind(handle: asyncio.Handle) -> str:
        callback = handle._callback
        task = getattr(callback, "__self__", None)
        if task is None or not hasattr(task, "get_coro"):
            return str(getattr(callback, "__qualname__", type(callback).__qualname__))
        coro = task.get_coro()
        kind = str(getattr(coro, "__qualname__", type(coro).__qualname__))
        frame = getattr(coro, "cr_frame", None)
        request = frame.f_locals.get("request") if frame is not None else None
        if request is not None:
            kind += " " + "/".join(request.path.split("/")[:3])
        return kind

    def _timed(self: asyncio.Handle) -> None:
        kind = _kind(self)
        start = time.thread_time()
        _run(self)
        _record[kind].append(time.thread_time() - start)

    asyncio.events.Handle._run = _timed  # type: ignore[method-assign]
    _gc: dict[str, float] = {}

    def _collected(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            _gc["start"] = time.thread_time()
        else:
            _record[f"gc generation {info['generation']}"].append(
                time.thread_time() - _gc["start"])

    gc.callbacks.append(_collected)

    def _write() -> None:
        prefix = os.environ["STAGER_HOLDS"]
        while True:
            time.sleep(2)
            if os.path.exists(prefix + ".reset"):
                os.unlink(prefix + ".reset")
                _record.clear()
            out = {}
            for kind, held in list(_record.items()):
                held = sorted(held)
                out[kind] = {"n": len(held), "p50_us": held[len(held) // 2] * 1e6,
                             "p99_us": held[int(len(held) * 0.99)] * 1e6,
                             "max_us": held[-1] * 1e6, "seconds": sum(held)}
            with open(f"{prefix}.{os.getpid()}.json", "w") as f:
                json.dump(out, f)

    threading.Thread(target=_write, daemon=True, name="holds").start()
