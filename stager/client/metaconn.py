"""The client's connection to the metadata server: requests and the stat cache.

:class:`~stager.client.async_client.AsyncClient` and the batched writer
(:mod:`stager.client.bulk`) both talk to the metadata server through one
:class:`MetaConnection`: a request names its route in the route table, sends a
model's JSON, and gets the answer's JSON back or the server's error raised as
its stager error.  The stat cache lives here too, so whoever changes a path
forgets its cached stat in the same place.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from ..dataplane.transport import ChunkBody
from ..errors import TRANSPORT_FAILURES, error_from_wire, unreachable
from ..protocol import paths
from ..protocol.models import FileInfo
from ..protocol.routes import Route

# scrub and fsck answer when they are done: minutes on big targets
LONG = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=None)


class MetaConnection:
    """Requests to the metadata server at ``url`` over the session ``session()``
    gives (the data plane's: one connection pool for everything a client does).

    A GET that fails in transport is sent again ``retries`` times with backoff;
    other methods are sent once, as they may have taken effect.
    """

    def __init__(self, url: str, session: Callable[[], aiohttp.ClientSession], *,
                 retries: int, stat_ttl: float, headers: Mapping[str, str] | None = None
                 ) -> None:
        self.url = url.rstrip("/")
        self.headers = dict(headers or {})     # Authorization, with a token
        self.retries = retries
        self.stat_ttl = stat_ttl
        self._session = session
        self._stats: dict[str, tuple[float, FileInfo]] = {}

    async def request(self, route: Route, *, body: Any = None,
                      query: Mapping[str, Any] | None = None,
                      timeout: aiohttp.ClientTimeout | None = None, **path_params: Any) -> Any:
        """Send ``route`` (its path parameters filled from ``path_params``) with the
        JSON ``body``; the answer's JSON, or its error raised."""
        url = route.url(self.url, query=query, **path_params)
        # ChunkBody: a large manifest is megabytes; raw bytes of that size make aiohttp warn.
        data = ChunkBody(json.dumps(body).encode()) if body is not None else None
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        hdrs.update(self.headers)
        extra = {"timeout": timeout} if timeout is not None else {}
        attempts = self.retries + 1 if route.method == "GET" else 1
        for attempt in range(attempts):
            try:
                async with self._session().request(route.method, url, data=data, headers=hdrs,
                                                   **extra) as resp:
                    status, raw = resp.status, await resp.read()
                answer = json.loads(raw) if status < 400 else None
            except (*TRANSPORT_FAILURES, ValueError) as exc:   # ValueError: not JSON
                if attempt + 1 < attempts:
                    await asyncio.sleep(0.1 * 2 ** attempt)
                    continue
                raise unreachable(exc, f"metadata server {self.url} unreachable",
                                  url=self.url) from exc
            if status >= 400:
                raise error_from_wire(status, raw)
            return answer
        raise AssertionError("unreachable")

    # -- the stat cache ----------------------------------------------------------------------
    def cached_stat(self, path: str) -> FileInfo | None:
        """The stat of normalised ``path`` taken less than ``stat_ttl`` seconds ago."""
        hit = self._stats.get(path)
        if hit is not None and time.monotonic() - hit[0] < self.stat_ttl:
            return hit[1]
        return None

    def remember_stat(self, path: str, info: FileInfo, taken: float) -> None:
        self._stats[path] = (taken, info)

    def forget(self, *names: str) -> None:
        """Drop the cached stats of ``names`` and of everything below them."""
        for name in names:
            name = paths.normalize(name)
            for key in [k for k in self._stats if paths.is_within(k, name)]:
                del self._stats[key]
