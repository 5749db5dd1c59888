"""Middlewares every stager server runs: errors as JSON with metrics, authorisation.

``served_middleware`` is the one place a server turns an exception into a
response, through :data:`stager.errors.ERROR_TABLE`.  ``auth_middleware``
(:mod:`.authmw`) checks tokens and capabilities against the route table.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web

from ..errors import InternalError, MethodNotAllowed, NotFound, PayloadTooLarge, StagerError
from .authmw import auth_middleware
from .metrics import ServerMetrics

log = logging.getLogger("stager.web")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
METRICS_KEY = web.AppKey("metrics", ServerMetrics)


def json_response(body: object, status: int = 200, headers: dict[str, str] | None = None
                  ) -> web.Response:
    return web.Response(body=encode_json(body), status=status,
                        content_type="application/json", headers=headers)


_ENCODE = msgspec.json.Encoder().encode


def encode_json(body: object, plain: Callable[[], object] | None = None) -> bytes:
    """Compact JSON, UTF-8.  msgspec writes it 5-10 times faster than ``json.dumps``
    (a 1,000-entry listing spent a fifth of its server time there); what it refuses
    (a lone surrogate in a string, a key that is not a string or an integer) goes
    through ``json``, which escapes the one and raises the same ``TypeError`` as
    before for anything it cannot write either.  ``plain()``, when given, is the body
    for ``json`` where ``body`` holds what only msgspec writes (``msgspec.Raw``)."""
    try:
        return _ENCODE(body)
    except (TypeError, ValueError):
        return json.dumps(body if plain is None else plain(), separators=(",", ":")).encode()


def error_response(exc: StagerError, headers: dict[str, str] | None = None) -> web.Response:
    return json_response(exc.to_json(), status=exc.status, headers=headers)


def _from_http(exc: web.HTTPException) -> StagerError:
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return PayloadTooLarge("request body too large")
    if isinstance(exc, web.HTTPNotFound):
        return NotFound("no such route")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return MethodNotAllowed(f"method not allowed; allowed: {sorted(exc.allowed_methods)}")
    err = StagerError(exc.reason or exc.text or f"HTTP {exc.status}")
    err.status, err.code = exc.status, "http_" + str(exc.status)
    return err


def _started(request: web.Request) -> bool:
    """True once bytes of a response went out (the test aiohttp itself uses)."""
    writer = request.writer
    return writer is not None and writer.output_size > 0


def _cut_short(request: web.Request, exc: StagerError) -> web.StreamResponse:
    """A streamed response failed after it began: no error response can follow.

    Appending a JSON error would put its bytes into the body the client reads, so
    the connection is closed instead and the client sees a short body (its
    Content-Length is not met).  The stand-in response returned fails to write on
    the closed transport, which aiohttp treats as a client that went away.
    """
    log.warning("%s %s failed after its response began; connection closed: %s",
                request.method, request.path, exc)
    if request.transport is not None:
        request.transport.close()
    return web.StreamResponse(status=exc.status)


CLIENT_CLOSED_REQUEST = 499


def _client_gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


def _errors_answered(request: web.Request, exc: BaseException) -> web.StreamResponse:
    """The response for ``exc`` raised by a handler; re-raises what is not an error
    (a redirect, a cancellation, a reset with the client still there)."""
    if isinstance(exc, StagerError):
        if _started(request):
            return _cut_short(request, exc)
        return error_response(exc)
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        return error_response(_from_http(exc), headers={
            k: v for k, v in exc.headers.items() if k.lower() == "allow"})
    if isinstance(exc, ConnectionResetError):
        if not _client_gone(request):
            raise exc
        # Nothing can reach the client; the status is for the metrics (nginx's 499).
        log.info("%s %s: the client went away", request.method, request.path)
        return web.Response(status=CLIENT_CLOSED_REQUEST)
    if not isinstance(exc, Exception):      # CancelledError, KeyboardInterrupt, ...
        raise exc
    log.exception("unhandled error in %s %s", request.method, request.path, exc_info=exc)
    err = InternalError("internal server error; see the server log")
    if _started(request):
        return _cut_short(request, err)
    return error_response(err)


@web.middleware
async def served_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Errors as JSON, and each request counted and timed with the status it got: one
    layer, not two (each layer is a coroutine call on every request)."""
    start = time.perf_counter()
    status = 500
    try:
        try:
            response = await handler(request)
        except BaseException as exc:     # answered as JSON, or raised again as it came
            response = _errors_answered(request, exc)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        route = request.match_info.route
        request.app[METRICS_KEY].observe(
            route.handler.__name__ if route.resource is not None else "unmatched", status,
            time.perf_counter() - start)


MIDDLEWARES = (served_middleware, auth_middleware)
