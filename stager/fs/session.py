"""One AsyncClient per process and event loop, for a filesystem instance.

An aiohttp session belongs to the loop it was made on and must not be used
across ``fork`` (the child would share the parent's sockets).  So clients are
made lazily, inside a coroutine, one per running loop (stager's I/O loop for
blocking use; the caller's loop for ``asynchronous=True``), and made again in a
forked child.  A client inherited across ``fork`` is kept, never closed, in the
child: closing it would shut sockets the parent still uses.
"""

from __future__ import annotations

import asyncio
import os
import threading

from ..client import AsyncClient
from ..config import Config

_INHERITED: list[AsyncClient] = []        # see the module docstring
_CLOSING: set[asyncio.Task[None]] = set()
CLOSE_TIMEOUT = 5.0


class ClientHolder:
    def __init__(self, meta_url: str, config: Config) -> None:
        self.meta_url = meta_url
        self.config = config
        self.pid = os.getpid()
        self._clients: dict[asyncio.AbstractEventLoop, AsyncClient] = {}
        self._lock = threading.Lock()

    def get(self) -> AsyncClient:
        """The client for the running loop of this process (call inside a coroutine)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._after_fork()
            client = self._clients.get(loop)
            if client is None:
                client = self._clients[loop] = AsyncClient(self.meta_url, config=self.config)
            for gone in [lp for lp in self._clients if lp.is_closed()]:
                _close_without_loop(self._clients.pop(gone))
            return client

    def current(self) -> AsyncClient | None:
        try:
            return self._clients.get(asyncio.get_running_loop())
        except RuntimeError:
            return None

    async def aclose(self) -> None:
        """Close every client; the running loop's one is awaited."""
        with self._lock:
            self._after_fork()
            client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()
        self.close()

    def close(self) -> None:
        """Close every client, from any thread (also from a finalizer at exit)."""
        with self._lock:
            self._after_fork()
            clients, self._clients = self._clients, {}
        for loop, client in clients.items():
            _close(client, loop)

    def _after_fork(self) -> None:
        if self.pid != os.getpid():
            _INHERITED.extend(self._clients.values())
            self._clients = {}
            self.pid = os.getpid()


def _close(client: AsyncClient, loop: asyncio.AbstractEventLoop) -> None:
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop.is_closed():
        _close_without_loop(client)
    elif running is loop:
        task = loop.create_task(client.close())
        _CLOSING.add(task)
        task.add_done_callback(_CLOSING.discard)
    elif loop.is_running():
        try:
            asyncio.run_coroutine_threadsafe(client.close(), loop).result(CLOSE_TIMEOUT)
        except (TimeoutError, RuntimeError):
            _close_without_loop(client)
    elif running is None:
        loop.run_until_complete(client.close())
    else:
        _close_without_loop(client)


def _close_without_loop(client: AsyncClient) -> None:
    """No loop can run the close: shut the sockets directly (as fsspec's http does)."""
    session = getattr(client, "_session", None)   # AsyncClient's session, if it made one
    connector = getattr(session, "connector", None)
    if connector is not None and not connector.closed:
        connector._close()   # the synchronous close: there is no loop to await on
