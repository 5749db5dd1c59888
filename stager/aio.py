"""Small asyncio helpers shared by every layer (and the one directory fsync)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
LOOP_KINDS = ("auto", "uvloop", "asyncio")


def loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop maker for config ``event_loop``: uvloop's for ``"uvloop"``, and
    for ``"auto"`` when uvloop is installed; ``None`` (asyncio's own) otherwise."""
    if kind not in LOOP_KINDS:
        raise ValueError(f"event_loop must be one of {', '.join(LOOP_KINDS)}, not {kind!r}")
    if kind != "asyncio":
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise
        else:
            return uvloop.new_event_loop
    return None


async def gather_or_cancel(jobs: Iterable[Awaitable[T]]) -> list[T]:
    """Run awaitables concurrently; on the first error cancel the rest, then raise it."""
    tasks = [asyncio.ensure_future(j) for j in jobs]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]]) -> None:
    tasks = list(tasks)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def wait_for_wake(event: asyncio.Event, timeout: float) -> None:
    """Sleep until ``event`` is set or ``timeout`` seconds pass, then clear it: the wait
    of a background loop that runs on a timer and can be woken early."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        pass
    event.clear()


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make the names in ``directory`` durable: what a rename into place needs next
    (blocking: call it in a thread)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def keep_doing(work: Callable[[], Awaitable[Any]], interval: float, what: str,
                     log: logging.Logger, *, wait_first: bool = False) -> None:
    """``work()`` every ``interval`` seconds, forever (until cancelled).  A failure the
    server expects (its store or a peer down: a :class:`~stager.errors.StagerError` or
    ``OSError``) is logged once until ``work`` succeeds again; any other with its
    traceback, each time."""
    from .errors import StagerError

    failing = False
    while True:
        if wait_first:
            await asyncio.sleep(interval)
        try:
            await work()
            failing = False
        except (StagerError, OSError) as exc:
            if not failing:
                log.warning("%s failed: %s; will retry", what, exc)
            failing = True
        except Exception:
            log.exception("%s failed; will retry", what)
        if not wait_first:
            await asyncio.sleep(interval)
