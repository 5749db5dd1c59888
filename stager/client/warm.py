"""``stager warm PATH``: an attached tree's chunks filled ahead of a job.

Warming asks the metadata server to fill chunks (route ``fill``), a batch at a time,
``parallel`` batches at once: the bytes go from the source to the data servers and
never through this process.  A chunk filled already answers at once, so a warm
that stopped is simply run again (resumable), and a second run fetches nothing.
The order is the files' path order, or the order a Loader plan reads them
(``--plan``: :func:`stager.loader.warmplan.plan_order` works it out; this module
takes the order as given, the client layer knowing nothing of Loaders).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import BadRequest, NotFound, StagerError
from ..layout import chunk_length
from ..protocol.cache import Filled, FillItem
from ..protocol.models import FileInfo

if TYPE_CHECKING:
    from .async_client import AsyncClient

BATCH_CHUNKS = 64           # chunks per fill request (256 MiB of 4 MiB chunks)


@dataclass(frozen=True)
class PlanSpec:
    """``seed=S,world=W,epoch=E[,batch=B]``: the Loader plan whose reads warm follows."""

    seed: int = 0
    world: int = 1
    epoch: int = 0
    batch: int = 1

    @classmethod
    def parse(cls, text: str) -> PlanSpec:
        values: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            if not sep or key not in ("seed", "world", "epoch", "batch") or key in values:
                raise BadRequest(f"--plan {text!r}: expected seed=S,world=W,epoch=E[,batch=B]")
            try:
                values[key] = int(value)
            except ValueError:
                raise BadRequest(f"--plan {text!r}: {key} must be an integer") from None
        spec = cls(**values)
        if spec.world < 1 or spec.batch < 1 or spec.epoch < 0 or spec.seed < 0:
            raise BadRequest(f"--plan {text!r}: world and batch must be at least 1, "
                             "seed and epoch at least 0")
        return spec


@dataclass(frozen=True)
class WarmResult:
    files: int
    chunks: int
    bytes_fetched: int
    bytes_cached_before: int


Chunk = tuple[FileInfo, int]


async def cached_files(client: AsyncClient, path: str) -> list[FileInfo]:
    """The cached files at or below ``path``, in path order."""
    info = await client.stat(path, cached=False)
    files = [info] if not info.is_dir else [f async for f in client.walk(path)
                                            if not f.is_dir]
    files = sorted((f for f in files if f.layout is not None and f.layout.cached),
                   key=lambda f: f.path)
    if not files:
        raise NotFound(f"{path} holds no file of an attached directory", path=path)
    return files


def path_order(files: Sequence[FileInfo]) -> list[Chunk]:
    return [(f, i) for f in files if f.layout is not None
            for i in range(f.layout.chunk_count(f.size))]


async def warm(client: AsyncClient, path: str, *, parallel: int = 8,
               order: Sequence[Chunk] | None = None,
               on_bytes: Callable[[int], None] | None = None,
               on_total: Callable[[int], None] | None = None) -> WarmResult:
    """Fill the chunks of the cached files below ``path`` (in ``order`` when given,
    else path order); raises the first file's error after trying every batch."""
    if parallel < 1:
        raise BadRequest(f"parallel must be at least 1, not {parallel}")
    chunks = list(order) if order is not None else path_order(await cached_files(client, path))
    files = {f.file_id for f, _ in chunks}

    def length(c: Chunk) -> int:
        f, i = c
        assert f.layout is not None
        return chunk_length(f.layout.chunk_size, f.size, i)

    if on_total is not None:
        on_total(sum(length(c) for c in chunks))
    limit = asyncio.Semaphore(parallel)
    fetched = cached = 0
    errors: list[StagerError] = []

    async def batch(part: Sequence[Chunk]) -> None:
        nonlocal fetched, cached
        items: dict[str, list[Chunk]] = {}
        for f, i in part:
            assert f.file_id is not None
            items.setdefault(f.file_id, []).append((f, i))
        async with limit:
            answers = await client.fill([FillItem(fid, tuple(i for _, i in got))
                                         for fid, got in items.items()], warm=True)
        for got, answer in zip(items.values(), answers, strict=True):
            if isinstance(answer, StagerError):
                errors.append(answer)
                continue
            assert isinstance(answer, Filled)
            new = set(answer.fetched)
            for c in got:
                n = length(c)
                if c[1] in new:
                    fetched += n
                else:
                    cached += n
            if on_bytes is not None:
                on_bytes(sum(length(c) for c in got))

    await asyncio.gather(*(batch(chunks[s:s + BATCH_CHUNKS])
                           for s in range(0, len(chunks), BATCH_CHUNKS)))
    if errors:
        raise errors[0]
    return WarmResult(len(files), len(chunks), fetched, cached)
