"""The process holder: what one process made to talk to clusters, reset after ``fork``.

``Client``, the ``stager://`` filesystem and ``Loader`` run their coroutines
on one I/O thread per process, as fsspec's backends run on fsspec's, through
:class:`AsyncClient`\\ s whose aiohttp sessions belong to the loop and the
process they were made in.  All of them take both from :func:`current`:

- the I/O loop, started on first use.  It is uvloop's when config
  ``event_loop`` is ``"auto"`` (the default) and uvloop is installed: a
  Loader spends less CPU per sample on it (bench/NOTES.md: "The client's
  loop is uvloop").  The first caller in a process chooses the kind; later ones share it.
- one client per owner (a ``Client``, a filesystem) and loop, made on first
  use, closed by :meth:`ProcessHolder.release` and, for what is still open,
  when the process exits (:meth:`ProcessHolder.shutdown`, which stops the loop too).

The seam to the loop is fsspec's: an owner's public ``loop``, with
``fsspec.asyn.sync(owner.loop, fn, ...)`` to wait for a coroutine there and
:func:`schedule` to start one without waiting (from a finalizer, or on the
loop's own thread).

After ``fork`` (PyTorch DataLoader workers) the child gets a new, empty
holder, so it starts its own loop and clients on first use.  The parent's
holder is kept whole (``parent``) and never touched: the child's copies of
its loop and sessions share an epoll set and sockets with the parent, so
using, closing or even collecting them in the child (aiohttp's finalizers
close connections, and warn) would act on the parent's.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import os
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ..aio import loop_factory

if TYPE_CHECKING:
    from .async_client import AsyncClient

THREAD_NAME = "stager-io"
CLOSE_TIMEOUT = 5.0
T = TypeVar("T")
Loop = asyncio.AbstractEventLoop
_owners = itertools.count()
_background: set[asyncio.Future[Any]] = set()      # started by schedule, kept until done


def new_owner() -> int:
    """A key for a new owner of clients (a ``Client``, a filesystem); never reused."""
    return next(_owners)


class ProcessHolder:
    """This process's I/O loop, its clients (one per owner and loop) and other
    things made once per process (:meth:`once`)."""

    def __init__(self, parent: ProcessHolder | None = None) -> None:
        self.parent = parent            # the holder of the process this one was forked from
        self.loop: Loop | None = None   # the I/O loop, once started
        self._thread: threading.Thread | None = None
        # reentrant: a finalizer (release) may run in a collection inside a locked section
        self._lock = threading.RLock()
        self._clients: dict[tuple[int, Loop], AsyncClient] = {}
        self._once: dict[str, Any] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def io_loop(self, kind: str = "auto") -> Loop:
        """The I/O loop, started on first use (``kind``: config ``event_loop``)."""
        loop = self.loop
        if loop is not None:
            return loop
        with self._lock:
            if self.loop is None:
                new = (loop_factory(kind) or asyncio.new_event_loop)()
                self._thread = threading.Thread(target=new.run_forever, name=THREAD_NAME,
                                                daemon=True)
                self._thread.start()
                self.loop = new
            return self.loop

    def once(self, name: str, make: Callable[[], T]) -> T:
        """The thing called ``name`` made in this process, made by ``make`` on first use."""
        with self._lock:
            if name not in self._once:
                self._once[name] = make()
            return self._once[name]  # type: ignore[no-any-return]

    def client(self, owner: int, loop: Loop, make: Callable[[], AsyncClient]) -> AsyncClient:
        """``owner``'s client for ``loop``, made by ``make`` on first use.  Clients of
        loops that have ended meanwhile are closed then."""
        client = self._clients.get((owner, loop))
        if client is not None:
            return client
        with self._lock:
            client = self._clients.get((owner, loop))
            if client is not None:
                return client
            client = self._clients[owner, loop] = make()
            ended = [(key[1], self._clients.pop(key)) for key in list(self._clients)
                     if key[1].is_closed()]
        for gone, old in ended:
            self._close(old, gone)
        return client

    def release(self, owner: int) -> None:
        """Close ``owner``'s clients (those made in this process), from any thread and
        from finalizers; they are made again if the owner is used again."""
        for loop, client in self._take(owner):
            self._close(client, loop)

    async def arelease(self, owner: int) -> None:
        """:meth:`release`, the running loop's client awaited."""
        running = asyncio.get_running_loop()
        for loop, client in self._take(owner):
            if loop is running:
                await client.close()
            else:
                self._close(client, loop)

    def shutdown(self) -> None:
        """At exit: cancel what still runs on the I/O loop, close every client this
        process made, then stop the loop and close it.  Its thread is a daemon, frozen
        once the interpreter finalizes: anything that waited on it then (a prefetch
        stopped by a collected iterator) would wait forever; on a closed loop it ends."""
        loop, thread = self.loop, self._thread
        running = loop is not None and loop.is_running()
        if running:
            _wait_there(_cancel_tasks(spare=set(self._closing)), loop)
        with self._lock:
            clients, self._clients = self._clients, {}
        for (_, where), client in clients.items():
            self._close(client, where)
        if running and loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(CLOSE_TIMEOUT)
            if not thread.is_alive():
                loop.close()

    def _take(self, owner: int) -> list[tuple[Loop, AsyncClient]]:
        with self._lock:
            keys = [key for key in self._clients if key[0] == owner]
            return [(key[1], self._clients.pop(key)) for key in keys]

    def _close(self, client: AsyncClient, loop: Loop) -> None:
        """Close ``client`` on ``loop``, the one its session belongs to, from any thread."""
        try:
            running: Loop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:             # on the loop's own thread: it cannot wait for itself
            task = loop.create_task(client.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
            return
        if not (loop.is_running() and _wait_there(client.close(), loop)):
            _close_idle(client, loop)


def schedule(loop: Loop | None, fn: Callable[[], Coroutine[Any, Any, Any]]) -> None:
    """Start ``fn()`` on ``loop`` without waiting (safe on the loop's own thread and
    in a finalizer); nothing happens when the loop is gone."""
    if loop is None or loop.is_closed() or not loop.is_running():
        return
    try:
        on_loop = asyncio.get_running_loop() is loop
    except RuntimeError:
        on_loop = False
    if on_loop:
        task = asyncio.ensure_future(fn())
        _background.add(task)
        task.add_done_callback(_background.discard)
    else:
        asyncio.run_coroutine_threadsafe(fn(), loop)


def _wait_there(coro: Coroutine[Any, Any, None], loop: Loop) -> bool:
    """Run ``coro`` on ``loop``, running on another thread, for up to CLOSE_TIMEOUT
    seconds (then it goes on there); False when the loop closed meanwhile."""
    try:
        asyncio.run_coroutine_threadsafe(coro, loop).result(CLOSE_TIMEOUT)
    except TimeoutError:
        pass
    except RuntimeError:
        coro.close()
        if not loop.is_closed():
            raise
        return False
    return True


async def _cancel_tasks(spare: set[asyncio.Task[None]]) -> None:
    """Cancel every other task of the running loop but ``spare``, let them end, and finish
    its async generators (as ``asyncio.run`` does before it closes its loop)."""
    tasks = asyncio.all_tasks() - spare - {asyncio.current_task()}
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()


def _close_idle(client: AsyncClient, loop: Loop) -> None:
    """Close a client whose loop runs nowhere, on a thread of its own (this thread may be
    running another loop): on that loop while it is open, else on a new one (with its
    loop ended, aiohttp's close has nothing to wait for)."""
    run = asyncio.run if loop.is_closed() else loop.run_until_complete
    thread = threading.Thread(target=run, args=(client.close(),), name="stager-close")
    thread.start()
    thread.join(CLOSE_TIMEOUT)


_current = ProcessHolder()


def current() -> ProcessHolder:
    """The holder of this process."""
    return _current


def release(owner: int) -> None:
    """Close ``owner``'s clients of this process (a finalizer's callback: it finds the
    holder when it runs, so an owner collected in a forked child closes the child's)."""
    _current.release(owner)


def _after_fork_in_child() -> None:
    global _current
    _current = ProcessHolder(parent=_current)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(lambda: _current.shutdown())
