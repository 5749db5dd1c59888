"""An HTTP source that counts what it is asked: what a cache fill costs the source.

The test HTTP file server (:mod:`stager.testing.httpserver`) on an event loop in a
thread of its own, in the test's process, so a test reads its counts directly::

    server = CountingSource(root).start()
    client.attach(server.url + "/", "/view")
    ...
    assert server.gets["a.bin"] == 6          # one ranged GET per chunk
    server.close()

Only ranged GETs count (a fill reads a chunk's byte range); listings and HEADs do not.
:meth:`stop` takes the server down while the thread lives on (a source that died).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from ..web.server import start_sites, stop_sites
from .httpserver import make_app

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class CountingSource:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.gets: Counter[str] = Counter()     # ranged GETs by path below the root
        self.others: Counter[str] = Counter()   # every other request ("HEAD /a.bin", ...)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner: web.AppRunner | None = None
        self.sockets: list[socket.socket] = []
        self.url = ""

    def start(self) -> CountingSource:
        self.thread.start()

        @web.middleware
        async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.method == "GET" and "Range" in request.headers:
                self.gets[request.path.lstrip("/")] += 1
            else:
                self.others[f"{request.method} {request.path}"] += 1
            return await handler(request)

        async def begin() -> None:
            app = make_app(self.root)
            app.middlewares.append(count)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            self.sockets = await start_sites(self.runner, "127.0.0.1", 0)
            self.url = f"http://127.0.0.1:{self.sockets[0].getsockname()[1]}"

        asyncio.run_coroutine_threadsafe(begin(), self.loop).result(10)
        return self

    def stop(self) -> None:
        """Stop serving (the source is down from now on)."""
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(stop_sites(self.runner, self.sockets),
                                             self.loop).result(10)
            self.runner = None

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def __enter__(self) -> CountingSource:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
