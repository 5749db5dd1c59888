"""Requests aiohttp's HTTP parser refuses, answered in the server's own error format.

A request that is not valid HTTP/1.1 (a request line or method that does not parse,
a header line with no colon or a bad character, a bad or repeated ``Content-Length``,
bad ``chunked`` framing, a line over the limit) never reaches the application: the
parser fails before any handler or middleware runs, and aiohttp answers it from its
connection class (``RequestHandler.handle_error``) with a plain-text 400.  aiohttp has
no hook for that answer (aio-libs/aiohttp#3287, #9882), so :class:`Runner` serves
the application over a connection class whose ``handle_error`` asks the application's
:data:`PARSE_ERRORS` page for it: stager's JSON error by default, S3's XML for the
gateway (``stager/s3/app.py``).  The connection still closes after the answer (the
parser has lost its place in the stream).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ..errors import BadRequest
from .middleware import error_response

log = logging.getLogger("stager.server")
ParsePage = Callable[[HttpProcessingError, int], web.Response]
PARSE_ERRORS: web.AppKey[ParsePage] = web.AppKey("parse_errors")
MAX_MESSAGE = 200           # characters of the parser's message (it quotes the request)


def parser_message(exc: HttpProcessingError) -> str:
    """The parser's reason, on one line and short: it quotes the bytes it refused."""
    text = " ".join(str(exc.message).split())
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 3] + "..."


def json_page(exc: HttpProcessingError, status: int) -> web.Response:
    """stager's JSON error (``bad_request``) for a request the parser refused."""
    error = BadRequest(f"malformed HTTP request: {parser_message(exc)}")
    error.status = status
    return error_response(error)


class _Connection(web.RequestHandler):
    """aiohttp's connection, with the application's page for a parser's refusal."""

    __slots__ = ("page",)

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if not (isinstance(exc, HttpProcessingError) and 400 <= status < 500) \
                or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        # a client's malformed request, not a fault here: one line, no traceback
        log.info("refused a malformed request from %s: %s", request.remote,
                 parser_message(exc))
        response = self.page(exc, status)
        response.force_close()
        return response


class _Server(web.Server):
    """aiohttp's protocol factory, making :class:`_Connection`\\ s."""

    page: ParsePage = json_page

    def __call__(self) -> web.RequestHandler:
        connection = _Connection(self, loop=self._loop, **self._kwargs)
        connection.page = self.page
        return connection


class Runner(web.AppRunner):
    """An :class:`aiohttp.web.AppRunner` whose connections answer a request the HTTP
    parser refuses with the application's :data:`PARSE_ERRORS` page (JSON unless the
    application sets one)."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        if not all(hasattr(server, name) for name in ("_kwargs", "_loop")):
            # an aiohttp whose server is built otherwise: its own plain-text 400s,
            # rather than connections that cannot be made
            log.warning("aiohttp %s: malformed requests get aiohttp's plain-text 400",
                        aiohttp.__version__)
            return server
        # the app's own server, made by aiohttp (its startup ran there): the same
        # object, as the subclass that makes our connections
        server.__class__ = _Server
        server.page = self.app.get(PARSE_ERRORS, json_page)  # type: ignore[attr-defined]
        return server
