"""Every target of this process heartbeats in one request (``POST /v1/heartbeats``).

A heartbeat costs the metadata server about as much CPU whether it carries one target
or eight: the request is the cost, not the beat (stager/protocol/heartbeats.py).  So
the targets a process serves (a node's data servers run in one process, or a test
cluster's) hand their beats to one :class:`Beats` per metadata server URL, which
gathers what arrives within a short window and sends it as one batch: each item
carries its target's own credential, so the batch speaks for exactly the targets
whose credentials this process holds.  Each sender gets its own item's answer, as if
it had sent it alone: ``(200, …)``, ``(404, None)`` for a target the server does
not know, or the error raised.

A metadata server older than the batch route answers it 404: from then on this URL
gets one request per target, as before.  A batch refused whole (its bearer credential
revoked, 401, or one item's credential another target's, 403) is sent again one request
per target, so that each target learns its own verdict, not its neighbour's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp

from ..auth.tls import client_ssl
from ..config import Config
from ..errors import (
    TRANSPORT_FAILURES,
    Forbidden,
    StagerError,
    Unauthenticated,
    Unavailable,
    error_from_wire,
)
from ..protocol.batch import batch_body, read_results
from ..protocol.heartbeats import BeatItem
from ..protocol.routes import route

Answer = tuple[int, object]
MAX_WINDOW = 0.05           # seconds a first beat waits for the others of its round


@dataclass
class _Pending:
    item: BeatItem
    auth: dict[str, str]            # the target's own headers (its credential, or none)
    answer: asyncio.Future[Answer] = field(default_factory=asyncio.Future)


class Beats:
    """The heartbeats to one metadata server at ``meta``, gathered into batches."""

    def __init__(self, session: aiohttp.ClientSession, meta: str, window: float) -> None:
        self.session, self.meta, self.window = session, meta, window
        self.batched = True         # False once the server answered it has no batch route
        self._pending: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None

    async def send(self, item: BeatItem, auth: dict[str, str]) -> Answer:
        """``item``'s heartbeat, in the next batch; its own answer."""
        if not self.batched:
            return await post_json(self.session, _one_url(self.meta, item), item.beat.to_json(),
                               auth)
        pending = _Pending(item, auth)
        self._pending.append(pending)
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        return await asyncio.shield(pending.answer)

    async def _flush(self) -> None:
        batch: list[_Pending] = []
        try:
            await asyncio.sleep(self.window)
            batch, self._pending, self._flusher = self._pending, [], None
            await self._deliver(batch)
        except (Exception, asyncio.CancelledError) as exc:
            if not batch:           # stopped while gathering: these are ours to answer
                batch, self._pending, self._flusher = self._pending, [], None
            # Each sender handles what a lone heartbeat would have raised: a stager
            # error or a transport failure; anything else (a malformed answer) as the
            # server being unavailable this round.
            told = exc if isinstance(exc, (StagerError, *TRANSPORT_FAILURES)) else \
                Unavailable(f"heartbeats to {self.meta}: {exc!r}")
            for p in batch:
                _fail(p.answer, told)
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def _deliver(self, batch: list[_Pending]) -> None:
        # The first target's own credential carries the request; every other item
        # proves itself with its own (its Authorization header's bearer text).
        auth = batch[0].auth
        body = batch_body([BeatItem(p.item.target_id, p.item.beat,
                                    None if i == 0 else _bearer(p.auth)).to_json()
                           for i, p in enumerate(batch)])
        try:
            status, answer = await post_json(self.session, route("heartbeats").url(self.meta),
                                         body, auth)
        except (Unauthenticated, Forbidden) as exc:
            status, answer = exc.status, None
        if status == 404:
            self.batched = False    # an older metadata server: one request per target
        if status in (401, 403, 404):
            await asyncio.gather(*(self._alone(p) for p in batch))
            return
        for p, result in zip(batch, read_results(answer, lambda taken: taken), strict=True):
            if isinstance(result, StagerError):
                if result.status == 404:
                    p.answer.set_result((404, None))
                else:
                    _fail(p.answer, result)
            else:
                p.answer.set_result((200, result))

    async def _alone(self, p: _Pending) -> None:
        try:
            p.answer.set_result(await post_json(self.session, _one_url(self.meta, p.item),
                                            p.item.beat.to_json(), p.auth))
        except Exception as exc:
            _fail(p.answer, exc)

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._flusher


def _fail(answer: asyncio.Future[Answer], exc: BaseException) -> None:
    """``answer`` fails with ``exc``, marked as seen: its sender, stopped meanwhile (a
    data server shutting down cancels them), may never await it, and asyncio would log
    "Future exception was never retrieved" for each at exit."""
    if not answer.done():
        answer.set_exception(exc)
        answer.exception()


class Hub:
    """This event loop's heartbeat senders, one per metadata server URL, over one
    session; shared by every target registering from this loop (:func:`joined`)."""

    def __init__(self, config: Config) -> None:
        timeout = aiohttp.ClientTimeout(total=max(config.heartbeat_interval * 2, 5.0))
        connector = aiohttp.TCPConnector(ssl=client_ssl(config.ca_file))
        self.session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        self.window = min(MAX_WINDOW, config.heartbeat_interval / 4)
        self.members = 0
        self._beats: dict[str, Beats] = {}

    def to(self, meta: str) -> Beats:
        beats = self._beats.get(meta)
        if beats is None:
            beats = self._beats[meta] = Beats(self.session, meta, self.window)
        return beats

    async def close(self) -> None:
        for beats in self._beats.values():
            await beats.close()
        await self.session.close()


_HUBS: dict[tuple[asyncio.AbstractEventLoop, str, float], Hub] = {}


@contextlib.asynccontextmanager
async def joined(config: Config) -> AsyncIterator[Hub]:
    """The hub of this loop (made by its first member, closed by its last)."""
    key = (asyncio.get_running_loop(), config.ca_file, config.heartbeat_interval)
    hub = _HUBS.get(key)
    if hub is None:
        hub = _HUBS[key] = Hub(config)
    hub.members += 1
    try:
        yield hub
    finally:
        hub.members -= 1
        if hub.members == 0:
            _HUBS.pop(key, None)
            await hub.close()


def _one_url(meta: str, item: BeatItem) -> str:
    return route("heartbeat").url(meta, target_id=item.target_id)


def _bearer(auth: dict[str, str]) -> str | None:
    scheme, _, text = auth.get("Authorization", "").partition(" ")
    return text.strip() or None if scheme.lower() == "bearer" else None


async def post_json(session: aiohttp.ClientSession, url: str, body: object,
                auth: dict[str, str]) -> Answer:
    """POST ``body`` as JSON: the status and the JSON answer (404: ``None``)."""
    async with session.post(url, data=json.dumps(body),
                            headers={"Content-Type": "application/json", **auth}) as resp:
        if resp.status == 404:
            return 404, None
        if resp.status >= 400:
            raise error_from_wire(resp.status, await resp.read())
        return resp.status, await resp.json()
