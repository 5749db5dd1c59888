"""Idempotency keys: a mutating request sent twice acts once.

A client whose connection to a metadata server broke after it sent a create,
commit, rename or remove cannot know whether it took effect; it sends the request
again with the same ``Idempotency-Key``, perhaps to another metadata server on the
same store (stager/client/metaconn.py).  This middleware, innermost on the
metadata server (after authentication), answers a key it has an answer for with
that answer, marked ``X-Stager-Replayed: 1``, and records the answer of every
successful request that carries one.  Failed requests are not recorded: their
operations change nothing, so a retry acts afresh.

The record goes to the store right after the operation, not in its transaction:
a server that dies between the two has acted without recording.  The client
numbers its tries (``X-Stager-Attempt``), and the key is handed to the operation
(``bind``): creates and commits (each a batch), and a whole file's PUT, find what
an earlier try did themselves (stager/meta/opkey.py), so their answers are not
recorded at all and the write path pays nothing for its keys.  A rename or remove caught in that gap
answers ``NotFound`` on its retry: an error the client sees, never an operation
applied twice.  A first try (``X-Stager-Attempt: 1``) is not looked up.

Keys are scoped by token, method and path, so one client's key never answers
another's request, nor a request to another route; recorded answers expire after ``ttl`` seconds.
An answer marked ``Cache-Control: no-store`` (a new token's text, an S3 secret: shown
once, kept nowhere in clear) is never recorded: a retry acts afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from aiohttp import web

from ..errors import BadRequest, StagerError
from ..protocol.headers import ATTEMPT, IDEMPOTENCY_KEY, REPLAYED
from .authmw import token_of

log = logging.getLogger("stager.idempotency")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
KEY_TTL = 3600.0            # seconds a recorded answer is kept
EXPIRE_EVERY = 300.0        # seconds between sweeps of expired answers
MAX_KEY = 128
SAFE = frozenset({"GET", "HEAD", "OPTIONS"})


class AnswerBook(Protocol):
    """Where answers are recorded: the metadata store."""

    async def recorded_answer(self, key: str) -> tuple[int, bytes] | None: ...

    async def record_answer(self, key: str, status: int, body: bytes, *,
                            now: float) -> bool: ...

    async def expire_answers(self, before: float) -> int: ...


Bind = Callable[[str, bool], None]


def install(app: web.Application, book: AnswerBook, *, bind: Bind | None = None,
            self_answering: frozenset[str] = frozenset(), ttl: float = KEY_TTL,
            clock: Callable[[], float] = time.time) -> None:
    """Answer repeated keys on ``app`` from ``book``; sweep answers older than ``ttl``.
    ``bind(key, retried)`` is called, in the handler's task, before a keyed request
    without a recorded answer is acted on (``retried``: maybe not the first try).
    The routes named in ``self_answering`` find an earlier try's work themselves
    (through ``bind``): their answers are neither recorded nor looked up."""
    app.middlewares.append(idempotency_middleware(book, clock, bind, self_answering))

    async def sweep(app: web.Application) -> AsyncIterator[None]:
        async def loop() -> None:
            while True:
                try:
                    gone = await book.expire_answers(clock() - ttl)
                    if gone:
                        log.info("forgot %d answers older than %.0f s", gone, ttl)
                except StagerError as exc:
                    log.warning("expiring answers: %s; will retry", exc)
                await asyncio.sleep(EXPIRE_EVERY)

        task = asyncio.create_task(loop())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(sweep)


def scoped_key(request: web.Request, key: str) -> str:
    """``key`` as recorded: with the token, method and path of ``request``.  (Not its
    body: read here, the handler could not stream it.  A client makes a new key for
    every operation, so a key is never sent with two different bodies.)"""
    if not key or len(key) > MAX_KEY or not key.isprintable():
        raise BadRequest(f"{IDEMPOTENCY_KEY} must be 1 to {MAX_KEY} printable characters")
    token = token_of(request)
    return f"{token.id if token else '-'} {request.method} {request.path} {key}"


def idempotency_middleware(book: AnswerBook, clock: Callable[[], float], bind: Bind | None,
                           self_answering: frozenset[str] = frozenset(),
                           ) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    # keys being acted on here: a second request with one waits for the first's answer
    running: dict[str, asyncio.Event] = {}

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        # the method first: a GET (a stat) looks no header up
        if request.method in SAFE or (key := request.headers.get(IDEMPOTENCY_KEY)) is None:
            return await handler(request)
        scoped = scoped_key(request, key)
        while (busy := running.get(scoped)) is not None:
            await busy.wait()
        # A client that numbers its tries says when this is its first: nothing to find
        # then.  One that does not is taken at its word that it may have sent it before.
        retried = request.headers.get(ATTEMPT) != "1"
        answers = request.match_info.route.name in self_answering
        found = await book.recorded_answer(scoped) if retried and not answers else None
        if found is not None:
            status, body = found
            return web.Response(status=status, body=body, headers={
                "Content-Type": "application/json", REPLAYED: "1"})
        running[scoped] = done = asyncio.Event()
        try:
            if bind is not None:
                bind(scoped, retried)
            response = await handler(request)
            if not answers and 200 <= response.status < 300 \
                    and isinstance(response, web.Response) and isinstance(response.body, bytes) \
                    and "no-store" not in response.headers.get("Cache-Control", ""):
                await _record(book, scoped, response, clock())
            return response
        finally:
            del running[scoped]
            done.set()

    return middleware


async def _record(book: AnswerBook, key: str, response: web.Response, now: float) -> None:
    """Record the answer; the operation is done whether or not that works, so a
    store that fails here only loses the replay, never the answer to this request."""
    assert isinstance(response.body, bytes)
    try:
        await book.record_answer(key, response.status, response.body, now=now)
    except StagerError as exc:
        log.warning("could not record the answer to %s: %s", key, exc)
