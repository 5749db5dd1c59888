"""Fixtures: real clusters on 127.0.0.1:0, clients bound to them, a guard on the loop."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from stager import AsyncClient, Client
from stager.config import load_config
from stager.testing import ThreadCluster

SLOW_CALLBACK = 0.25  # seconds a server callback may hold the loop before a test fails


class _SlowCallbacks(logging.Handler):
    """Collects asyncio's debug-mode reports of callbacks that blocked the loop."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "took" in message and "Executing" in message:
            self.records.append(message)


@pytest.fixture(scope="session")
def slow_callbacks() -> Iterator[_SlowCallbacks]:
    handler = _SlowCallbacks()
    logging.getLogger("asyncio").addHandler(handler)
    yield handler
    logging.getLogger("asyncio").removeHandler(handler)


def start_cluster(root: Path, data_servers: int = 3, **overrides: object) -> ThreadCluster:
    cluster = ThreadCluster(root, data_servers, **overrides)
    cluster.loop.set_debug(True)
    cluster.loop.slow_callback_duration = SLOW_CALLBACK
    cluster.start()
    return cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            slow_callbacks: _SlowCallbacks) -> Iterator[ThreadCluster]:
    """Three data servers (nodes node0..node2) and a metadata server, shared by a module."""
    c = start_cluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()


@pytest.fixture(autouse=True)
def _no_blocked_loop(slow_callbacks: _SlowCallbacks) -> Iterator[None]:
    """Fail any test during which a server callback blocked its event loop."""
    before = len(slow_callbacks.records)
    yield
    blocked = slow_callbacks.records[before:]
    assert not blocked, f"the event loop was blocked: {blocked}"


@pytest.fixture
def ns() -> str:
    """A fresh directory name in the namespace, so tests sharing a cluster never collide."""
    return f"/t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def client(cluster: ThreadCluster) -> Iterator[Client]:
    c = Client(cluster.meta_url, config=load_config(env={}))
    yield c
    c.close()


@pytest.fixture
async def aclient(cluster: ThreadCluster) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
        yield c


@pytest.fixture
def payload() -> callable:  # type: ignore[valid-type]
    """Random bytes of a given size (deterministic per size)."""
    def make(size: int) -> bytes:
        import random

        return random.Random(size).randbytes(size)
    return make


def pytest_configure(config: pytest.Config) -> None:
    os.environ.pop("STAGER_META_URL", None)
