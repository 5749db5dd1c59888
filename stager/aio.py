"""Small asyncio helpers shared by every layer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


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
