"""The client's connection to the metadata servers: requests, failover and the stat cache.

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
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import msgspec
from yarl import URL

from ..dataplane import rawhttp
from ..dataplane.transport import ChunkBody
from ..errors import TRANSPORT_FAILURES, NoTargets, Unavailable, error_from_wire, unreachable
from ..protocol import paths
from ..protocol.headers import ATTEMPT, IDEMPOTENCY_KEY
from ..protocol.metaurls import joined
from ..protocol.models import FileInfo
from ..protocol.routes import Route
from .cluster import Cluster

# scrub and fsck answer when they are done: minutes on big targets
LONG = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=None)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
log = logging.getLogger("stager.client")
# An answer's JSON: msgspec reads it several times faster than json.loads (a
# 1,000-entry listing is 300 KB); like json.loads it raises a ValueError on bad JSON.
_decode = msgspec.json.decode
# A raw body's answer (a gateway PUT's file info: a few hundred bytes) is read into
# this much; a longer one goes again through aiohttp, as a later try of the request.
DIRECT_ANSWER = 64 * 1024


class MetaConnection:
    """Requests to the metadata servers of ``cluster`` (any of them serves the same
    store), with its headers, over the session ``session()`` gives (the data plane's:
    one connection pool for everything a client does).

    A request that fails in transport goes to the next server, round after round
    (config ``retries`` rounds after the first, with backoff between them); the server that
    answered is tried first next time.  A mutating request carries an
    ``Idempotency-Key``, the same on every try: a server that already acted on it
    (the connection broke after the request went out) answers what it answered then
    instead of acting again (stager/web/idempotency.py).
    """

    def __init__(self, cluster: Cluster, session: Callable[[], aiohttp.ClientSession]) -> None:
        self.urls = cluster.urls
        self.headers = dict(cluster.headers)   # Authorization, with a token
        self.retries = cluster.config.retries
        self.stat_ttl = cluster.config.stat_cache_ttl
        self._session = session
        self._current = 0                      # the server that answered last
        self._stats: dict[str, tuple[float, FileInfo]] = {}

    @property
    def url(self) -> str:
        """The metadata server requests go to first: the one that answered last."""
        return self.urls[self._current]

    async def request(self, route: Route, *, body: Any = None,
                      query: Mapping[str, Any] | None = None,
                      timeout: aiohttp.ClientTimeout | None = None, settle: int = 0,
                      decode: Callable[[bytes], Any] = _decode,
                      raw: bytes | bytearray | memoryview | None = None,
                      small: bool = False, **path_params: Any) -> Any:
        """Send ``route`` (its path parameters filled from ``path_params``) with the
        JSON ``body``; the answer's JSON, or its error raised.

        ``settle``: a mutating request whose outcome stayed unknown (every server
        unreachable, or a 503: the database went away mid-commit) is sent again, with
        the same key, up to ``settle`` more times with backoff (from 0.25 s, at most
        4 s apart), so that a metadata tier that comes back answers what became of it.
        Sending the operation afresh instead could apply it twice, the second time
        over a later writer's.  ``decode`` reads a 2xx answer's bytes (a typed
        decoder skips the dicts: stager/client/listing.py).  ``raw``: bytes sent as
        they are instead of a JSON body (a small file's gateway PUT).  ``small``: the
        answer is a few hundred bytes (a file's info: the stat), so a request without a
        body may go through the raw client as a raw body does (:meth:`_direct`)."""
        _, _, answer = await self._settled(route, body, query, timeout, settle, {},
                                           decode, path_params, raw, small)
        return answer

    async def exchange(self, route: Route, *, body: Any = None,
                       query: Mapping[str, Any] | None = None,
                       timeout: aiohttp.ClientTimeout | None = None,
                       headers: Mapping[str, str] | None = None, **path_params: Any
                       ) -> tuple[int, Mapping[str, str], bytes]:
        """:meth:`request` with more ``headers``, answering (status, headers, body as
        sent: a ``Content-Encoding`` is not undone), or the error raised."""
        return await self._settled(route, body, query, timeout, 0, headers or {}, bytes,
                                   path_params)

    async def _settled(self, route: Route, body: Any, query: Mapping[str, Any] | None,
                       timeout: aiohttp.ClientTimeout | None, settle: int,
                       headers: Mapping[str, str], parse: Callable[[bytes], Any],
                       path_params: Mapping[str, Any],
                       raw: bytes | bytearray | memoryview | None = None, small: bool = False
                       ) -> tuple[int, Mapping[str, str], Any]:
        raw_body = json.dumps(body).encode() if body is not None else raw
        hdrs = {"Content-Type": "application/json"} if body is not None else \
            {"Content-Type": "application/octet-stream"} if raw is not None else {}
        hdrs.update(headers)
        hdrs.update(self.headers)
        if route.method not in SAFE_METHODS:
            hdrs[IDEMPOTENCY_KEY] = uuid.uuid4().hex
        else:
            settle = 0
        tried = 0
        while True:
            try:
                return await self._send(route, raw_body, hdrs, query, timeout, tried, parse,
                                        path_params,
                                        direct=raw is not None or small and body is None)
            except Unavailable as exc:
                if settle <= 0 or isinstance(exc, NoTargets):
                    raise
                settle -= 1
                await asyncio.sleep(min(0.25 * 2 ** min(tried // len(self.urls), 4), 4.0))
                tried += (self.retries + 1) * len(self.urls)

    async def _send(self, route: Route, raw_body: bytes | bytearray | memoryview | None,
                    hdrs: dict[str, str],
                    query: Mapping[str, Any] | None, timeout: aiohttp.ClientTimeout | None,
                    tried: int, parse: Callable[[bytes], Any], path_params: Mapping[str, Any],
                    *, direct: bool = False) -> tuple[int, Mapping[str, str], Any]:
        """One round of tries over the servers (``tried``: tries made before it);
        ``direct``: ``raw_body`` is a raw body (``request(raw=...)``), or there is none
        and the answer is small (``request(small=True)``): the request may go through
        the raw client (:meth:`_direct`)."""
        extra = {"timeout": timeout} if timeout is not None else {}
        first, count = self._current, len(self.urls)
        tries = (self.retries + 1) * count
        pool = self._direct(query, timeout) if direct else None
        bumped = 0          # tries sent again through aiohttp (see below)
        for attempt in range(tries):
            which = (first + attempt) % count
            base = self.urls[which]
            # quoted already (Route.target quotes every part): yarl need not check it
            # again; a base URL with a non-ASCII host name still goes through yarl (IDNA)
            text = route.url(base, query=query, **path_params)
            if IDEMPOTENCY_KEY in hdrs:     # later tries look for the first's work
                hdrs[ATTEMPT] = str(tried + attempt + 1 + bumped)
            try:
                if pool is not None and text.isascii():
                    try:
                        status, answered, raw = await _raw_exchange(
                            pool, base, text[len(base.rstrip("/")):], route.method,
                            raw_body, hdrs)
                    except (rawhttp.Unsupported, rawhttp.LengthMismatch):
                        # An answer the raw client does not read (a file info past
                        # DIRECT_ANSWER): the request went through, so it goes again
                        # through aiohttp as a later try, which finds the first's work.
                        pool, bumped = None, bumped + 1
                        if IDEMPOTENCY_KEY in hdrs:
                            hdrs[ATTEMPT] = str(tried + attempt + 1 + bumped)
                        status, answered, raw = await self._exchange(route, text, raw_body,
                                                                     hdrs, extra)
                else:
                    status, answered, raw = await self._exchange(route, text, raw_body, hdrs,
                                                                 extra)
                answer = parse(raw) if status < 400 else None
            except (*TRANSPORT_FAILURES, ValueError) as exc:   # ValueError: not JSON
                if attempt + 1 >= tries:
                    raise unreachable(exc, f"metadata server {joined(self.urls)} unreachable",
                                      url=base) from exc
                log.info("metadata server %s: %s; trying %s", base, exc,
                         self.urls[(which + 1) % count])
                if (attempt + 1) % count == 0:          # a whole round failed
                    await asyncio.sleep(0.1 * 2 ** ((attempt + 1) // count - 1))
                continue
            self._current = which
            if status >= 400:
                raise error_from_wire(status, raw)
            return status, answered, answer
        raise AssertionError("unreachable")

    def _direct(self, query: Mapping[str, Any] | None, timeout: aiohttp.ClientTimeout | None
                ) -> rawhttp.RawPool | None:
        """The raw client's pool for a request with a raw body (a small file's gateway
        PUT) or a small answer (a stat), no query and the session's timeouts (the pool's
        are the same: connect, and each silence of the server), while the session is
        open; else None.

        aiohttp's client request (its request and response objects, writer task,
        headers multidicts, cookie jar) cost a 1 KiB gateway PUT about twice the
        client CPU of one ``write`` and one read on a kept-alive raw connection
        (``python -m bench.profile_floors small``); the server cannot tell them apart.
        """
        if query is not None or timeout is not None:
            return None
        session = self._session()
        pool = getattr(session.connector, "raw", None)
        return pool if isinstance(pool, rawhttp.RawPool) and not session.closed else None

    async def _exchange(self, route: Route, text: str,
                        raw_body: bytes | bytearray | memoryview | None,
                        hdrs: Mapping[str, str], extra: Mapping[str, Any]
                        ) -> tuple[int, Mapping[str, str], bytes]:
        """One try through aiohttp: (status, headers, body)."""
        url = URL(text, encoded=True) if text.isascii() else URL(text)
        # ChunkBody: a large manifest is megabytes; raw bytes of that size make
        # aiohttp warn.  A new one each try: a payload is written once.
        data = ChunkBody(raw_body) if raw_body is not None else None
        async with self._session().request(route.method, url, data=data, headers=hdrs,
                                           **extra) as resp:
            return resp.status, resp.headers, await resp.read()

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


async def _raw_exchange(pool: rawhttp.RawPool, base: str, target: str, method: str,
                        raw_body: bytes | bytearray | memoryview | None,
                        hdrs: Mapping[str, str]) -> tuple[int, Mapping[str, str], bytes]:
    """One try through the data plane's raw pool (a raw body, or none): (status,
    headers with lower-case names, body)."""
    answer = memoryview(bytearray(DIRECT_ANSWER))
    sent = None if raw_body is None else memoryview(raw_body).cast("B")
    resp = await pool.request(base, method, target, hdrs, sent,  # type: ignore[arg-type]
                              answer, exact=False)
    if resp.status >= 400:
        return resp.status, resp.headers, resp.body
    return resp.status, resp.headers, bytes(answer[:resp.length])
