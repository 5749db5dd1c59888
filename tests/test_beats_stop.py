"""A data server stopping while heartbeats wait for their batch: each waiting sender
is cancelled, then the batch's flusher fails their answers (stager/data/beats.py).
Nobody awaits those answers any more, and asyncio logged "Future exception was never
retrieved" for each at exit, once per target, on every stop of a cluster."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import aiohttp

from stager.data.beats import Beats
from stager.protocol.heartbeats import BeatItem
from stager.protocol.messages import Heartbeat


async def test_a_stop_while_beats_wait_logs_no_unretrieved_exception() -> None:
    loop = asyncio.get_running_loop()
    logged: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: logged.append(context))
    try:
        async with aiohttp.ClientSession() as session:
            beats = Beats(session, "http://127.0.0.1:9", window=60.0)   # never flushed
            senders = [asyncio.create_task(beats.send(BeatItem(f"t{i}", Heartbeat()), {}))
                       for i in range(3)]
            await asyncio.sleep(0)              # each is waiting on its answer
            for sender in senders:              # the server's stop cancels them first...
                sender.cancel()
            await asyncio.gather(*senders, return_exceptions=True)
            await beats.close()                 # ...then the flusher, which fails the answers
            del senders
            gc.collect()
            await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert not [c for c in logged if "never retrieved" in str(c.get("message", ""))], logged
