"""Fault drivers for the scenarios: kill -9 data servers, damage chunk copies."""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from reliability_util import chunk_path, flip_byte, truncate

from stager import AsyncClient
from stager.layout import chunk_targets
from stager.protocol.models import FileInfo, chunk_id
from stager.testing import ProcessCluster

SMALL = 64 * 1024


def seconds(name: str, default: float) -> float:
    """A scenario's duration: ``STAGER_<NAME>_SECONDS`` from the environment, else the
    default CI uses."""
    return float(os.environ.get(f"STAGER_{name.upper()}_SECONDS", default))


def make_bytes(key: str, size: int) -> bytes:
    """Deterministic bytes for ``key``: what a writer meant to store there."""
    return random.Random(key).randbytes(size)


@dataclass
class DataKiller:
    """Every ``period`` seconds, SIGKILL one data server; ``stager up --restart``
    starts it again on the same root and port."""

    cluster: ProcessCluster
    period: float
    rng: random.Random
    kills: int = 0
    downtimes: list[float] = field(default_factory=list)
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)   # one fault at a time

    async def kill_one(self) -> int:
        async with self.busy:
            i = self.rng.randrange(self.cluster.n)
            old = self.cluster.data_pid(i)
            self.cluster.kill_data(i)
            start = time.monotonic()
            await asyncio.to_thread(self.cluster.wait_restarted, "data", i, old)
            self.downtimes.append(round(time.monotonic() - start, 2))
            self.kills += 1
            return i

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.period)
                return
            except TimeoutError:
                pass
            await self.kill_one()


def damage(roots: dict[str, Path], info: FileInfo, index: int, copy: int, how: str) -> str:
    """Flip a byte in, or truncate, copy ``copy`` of chunk ``index``; returns its target."""
    assert info.layout is not None and info.file_id is not None
    target = chunk_targets(info.layout, index)[copy]
    path = chunk_path(roots, target, chunk_id(info.file_id, index))
    (flip_byte if how == "flip" else truncate)(path)
    return target


async def read_back(c: AsyncClient, expected: dict[str, bytes]) -> tuple[int, list[str]]:
    """(bytes read, paths whose bytes differ or could not be read)."""
    bad = []
    total = 0
    for path, body in expected.items():
        try:
            got = await c.cat(path)
        except OSError as exc:
            bad.append(f"{path}: {type(exc).__name__}: {exc}")
            continue
        total += len(got)
        if got != body:
            bad.append(f"{path}: {len(got)} bytes differ from the {len(body)} written")
    return total, bad
