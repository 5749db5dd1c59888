"""Helpers for the reliability tests: chunk files on disk, polling, corruption."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from stager.config import load_config
from stager.layout import chunk_targets
from stager.meta.service import MetaService
from stager.meta.store.sqlite.store import SQLiteStore
from stager.protocol.models import FileInfo, TargetInfo, chunk_id
from stager.storage import chunkfile

T = TypeVar("T")


def wait_for(fn: Callable[[], T | None], timeout: float = 5.0, what: str = "") -> T:
    """``fn()``'s first truthy value, asked every 0.05 s; AssertionError after
    ``timeout`` seconds, naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what or fn}")
        time.sleep(0.05)


def target_roots(root: Path, n: int) -> dict[str, Path]:
    """Target id → data server root, for ``root/data{i}`` as the test clusters lay out."""
    import json

    out = {}
    for i in range(n):
        d = root / f"data{i}"
        out[json.loads((d / "target.json").read_text())["target_id"]] = d
    return out


def chunk_path(roots: dict[str, Path], target: str, chunk: str) -> Path:
    """Where a data server keeps ``chunk`` (the ChunkStore layout; not opened through
    ChunkStore, whose start-up sweep would delete a live server's temporary files)."""
    file_id = chunk.split(".", 1)[0]
    return roots[target] / "chunks" / file_id[:2] / file_id[2:4] / chunk


def verify_copy(path: Path) -> None:
    """Check a chunk file's every checksum; CorruptChunk or FileNotFoundError if bad."""
    fd = os.open(path, os.O_RDONLY)
    try:
        meta = chunkfile.read_meta(fd, os.fstat(fd).st_size, path.name)
        chunkfile.verify_all(fd, meta, path.name)
    finally:
        os.close(fd)


def replicas_on_disk(roots: dict[str, Path], info: FileInfo) -> list[str]:
    """Problems with the copies ``info``'s layout names: missing, corrupt, too few
    or not on distinct nodes.  Empty when every chunk has all its verified copies."""
    assert info.layout is not None and info.file_id is not None
    problems = []
    lay = info.layout
    for index in range(lay.chunk_count(info.size)):
        name = chunk_id(info.file_id, index)
        holders = chunk_targets(lay, index)
        nodes = {lay.nodes[lay.targets.index(t)] for t in holders}
        if len(holders) != lay.replicas or len(nodes) != len(holders):
            problems.append(f"{name}: {holders} on nodes {sorted(nodes)}")
        for t in holders:
            try:
                verify_copy(chunk_path(roots, t, name))
            except (OSError, KeyError) as exc:
                problems.append(f"{name} on {t}: {exc}")
    return problems


def flip_byte(path: Path, offset: int = 100) -> None:
    raw = bytearray(path.read_bytes())
    raw[min(offset, len(raw) // 2)] ^= 0xFF
    path.write_bytes(bytes(raw))


def truncate(path: Path, keep: int = 1000) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def eventually(check: Callable[[], bool], timeout: float = 20, what: str = "") -> float:
    """Wait until ``check()``; returns the seconds it took."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.05)
    return time.monotonic() - start


async def aeventually(check: Callable[[], Awaitable[bool]], timeout: float = 20,
                      what: str = "") -> float:
    start = time.monotonic()
    while not await check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


class Clock:
    """A clock a test moves by hand (``clock.now += 11``), for a service given it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def clocked_service(tmp_path: Path, targets: int, url: Callable[[int], str],
                          boot: bool = False) -> AsyncIterator[tuple[MetaService, Clock]]:
    """A MetaService on SQLite with a :class:`Clock`, ``target_timeout`` 10 s, and
    targets ``t0``... on nodes ``node0``... at ``url(i)`` (boot ids ``boot0``... with
    ``boot``), registered."""
    clock = Clock()
    svc = MetaService(SQLiteStore(tmp_path / "meta.sqlite3"),
                      load_config({"target_timeout": 10.0}, env={}), clock=clock)
    await svc.start()
    try:
        for i in range(targets):
            await svc.register_target(TargetInfo(f"t{i}", f"node{i}", url(i), capacity=1 << 30,
                                                 boot=f"boot{i}" if boot else ""))
        yield svc, clock
    finally:
        svc.close()


async def stop_data_until_down(cluster: Any, client: Any, i: int, timeout: float = 15.0) -> str:
    """Stop ``cluster``'s data server ``i`` (a ThreadCluster) and wait until the metadata
    server lists its target down (``client``: an AsyncClient); the target's id."""
    gone = cluster.target_id(i)
    cluster.stop_data(i)
    deadline = time.monotonic() + timeout
    while any(t.id == gone and t.up for t in await client.targets()):
        assert time.monotonic() < deadline, f"target {gone} is still up"
        await asyncio.sleep(0.1)
    return gone
