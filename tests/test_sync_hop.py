"""The sync Client's hop to the I/O loop (:func:`stager.client.sync.run_there`): what
the coroutine returns or raises comes back as fsspec's ``sync`` gives it, a wait can
be interrupted with Ctrl-C, and the loop's own thread is refused."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
from fsspec.asyn import FSTimeoutError

from stager.client.holder import current
from stager.client.sync import Client, run_there
from stager.testing import ThreadCluster


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    yield current().io_loop()


async def _answer(value: object, *, after: float = 0.0) -> object:
    await asyncio.sleep(after)
    return value


async def _fail(exc: BaseException) -> None:
    await asyncio.sleep(0)
    raise exc


def test_a_result_comes_back(loop: asyncio.AbstractEventLoop) -> None:
    assert run_there(loop, _answer, 7) == 7
    assert run_there(loop, _answer, None, after=0.01) is None
    assert [run_there(loop, _answer, i) for i in range(100)] == list(range(100))


def test_errors_come_back_as_raised(loop: asyncio.AbstractEventLoop) -> None:
    with pytest.raises(FileNotFoundError, match="gone"):
        run_there(loop, _fail, FileNotFoundError("gone"))
    with pytest.raises(FSTimeoutError):         # as fsspec's sync raises a timeout
        run_there(loop, _fail, TimeoutError())
    with pytest.raises(asyncio.CancelledError):
        run_there(loop, _fail, asyncio.CancelledError())
    with pytest.raises(KeyboardInterrupt):      # raised here; the loop's thread lives on
        run_there(loop, _fail, KeyboardInterrupt())
    assert run_there(loop, _answer, "still") == "still"


def test_the_loops_own_thread_is_refused(loop: asyncio.AbstractEventLoop) -> None:
    async def inside() -> None:
        with pytest.raises(NotImplementedError):
            run_there(loop, _answer, 1)

    run_there(loop, inside)


def test_ctrl_c_stops_the_wait(loop: asyncio.AbstractEventLoop) -> None:
    """SIGINT during a long call interrupts this thread's wait at once; the call goes on
    on the loop (as with fsspec's sync), and the next one is served."""
    # Python's own SIGINT handler for this test: an xdist worker ignores SIGINT (its
    # controller stops it otherwise), so the wait would run its 60 s and return
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_there(loop, _answer, 1, after=60.0)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, handler)
    assert time.monotonic() - start < 3.0
    assert run_there(loop, _answer, 2) == 2


def test_a_closed_client_makes_its_session_again(cluster: ThreadCluster, ns: str) -> None:
    """The loop and AsyncClient a Client keeps between calls are dropped by close(): the
    next call makes a new session (the old one is closed), as before they were kept."""
    c = Client(cluster.meta_url)
    try:
        c.pipe(f"{ns}/k", b"kept")
        first = c.aio
        assert c.cat(f"{ns}/k") == b"kept" and c.aio is first
        c.close()
        assert c.cat(f"{ns}/k") == b"kept"
        assert c.aio is not first
    finally:
        c.close()
