"""The S3 gateway's aiohttp app: one catch-all route, dispatched on method and query.

Every handler — here, in :mod:`.buckets`, :mod:`.objects`, :mod:`.listing`, and
the multipart ones in ``stager/s3/multipart.py`` — has the same shape::

    async def handler(ctx: S3Context) -> web.StreamResponse

:class:`~stager.s3.context.S3Context` (``stager/s3/context.py``) is the request's
context: ``ctx.request`` (aiohttp), ``ctx.client`` (an ``AsyncClient`` acting with
the principal's token; ``None`` token on an open cluster), ``ctx.bucket``,
``ctx.key``, ``ctx.path`` (the key's stager path), ``ctx.request_id``,
``ctx.principal``, ``ctx.gateway`` (app-wide: the clients per token), and
``ctx.payload()``, the body decoded
(``aws-chunked``) and checked (Content-MD5, ``x-amz-checksum-*``, chunk
signatures) as it streams.  Before any handler runs, :func:`~stager.s3.syntax.check`
refuses the malformed numbers and header-bound values that are easy to misread in
a handler.  Handlers raise :class:`~stager.s3.errors.S3Error` or
let a :class:`~stager.errors.StagerError` through: the middleware here turns both
into S3's XML error (one place: :func:`~stager.s3.errors.from_stager`) and puts
``x-amz-request-id`` and ``x-amz-id-2`` on every answer.

Multipart requests go to ``stager/s3/multipart.py``, by these names (each an
``async def NAME(ctx: S3Context) -> web.StreamResponse``):

====================================  =================================
request                               function in ``multipart.py``
====================================  =================================
``POST /b/k?uploads``                 ``create_upload``
``PUT /b/k?partNumber=N&uploadId=U``  ``upload_part`` (``upload_part_copy``
                                      when ``x-amz-copy-source`` is set)
``POST /b/k?uploadId=U``              ``complete_upload``
``DELETE /b/k?uploadId=U``            ``abort_upload``
``GET /b/k?uploadId=U``               ``list_parts``
``GET /b?uploads``                    ``list_uploads``
====================================  =================================

Until a function exists the request is answered ``NotImplemented`` (501).
"""

from __future__ import annotations

import importlib
import logging
import secrets
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ..config import Config
from ..errors import StagerError
from ..web.parseerrors import PARSE_ERRORS
from . import buckets, listing, objects, syntax
from .auth import Authenticator
from .context import Gateway, S3Context
from .errors import S3Error, from_parser, from_stager
from .memory import keep_freed_memory
from .names import Target, locate

log = logging.getLogger(__name__)

Handler = Callable[[S3Context], Awaitable[web.StreamResponse]]
GATEWAY = web.AppKey("s3_gateway", Gateway)
MULTIPART_MODULE = "stager.s3.multipart"


def multipart(name: str) -> Handler:
    """The multipart module's handler ``name`` (resolved per request, so the module
    may arrive later); ``NotImplemented`` while it is not there."""
    async def call(ctx: S3Context) -> web.StreamResponse:
        try:
            module = importlib.import_module(MULTIPART_MODULE)
        except ModuleNotFoundError as exc:
            if exc.name != MULTIPART_MODULE:
                raise
            module = None
        fn = getattr(module, name, None)
        if fn is None:
            raise S3Error("NotImplemented", f"multipart uploads ({name}) are not "
                          "implemented yet")
        response: web.StreamResponse = await fn(ctx)
        return response
    return call


def route(ctx: S3Context) -> Handler:
    """Which handler answers this request."""
    method, q = ctx.request.method, ctx.query
    if not ctx.bucket:
        if method in ("GET", "HEAD"):
            return buckets.list_buckets
        raise S3Error("MethodNotAllowed", f"{method} of the service")
    if not ctx.key:
        return _bucket_route(method, q)
    if "uploadId" in q:
        if method == "PUT":
            if "partNumber" not in q:
                raise S3Error("InvalidArgument", "an UploadPart without partNumber")
            return multipart("upload_part_copy" if "x-amz-copy-source" in ctx.headers
                             else "upload_part")
        by_method = {"POST": "complete_upload", "DELETE": "abort_upload", "GET": "list_parts"}
        if method in by_method:
            return multipart(by_method[method])
    if "uploads" in q and method == "POST":
        return multipart("create_upload")
    for sub in ("acl", "tagging", "retention", "legal-hold", "torrent", "restore",
                "select", "attributes"):
        if sub in q:
            raise S3Error("NotImplemented", f"?{sub} is not supported")
    handlers: dict[str, Handler] = {
        "GET": objects.get_object, "HEAD": objects.head_object,
        "PUT": objects.copy_object if "x-amz-copy-source" in ctx.headers
        else objects.put_object,
        "DELETE": objects.delete_object}
    if method not in handlers:
        raise S3Error("MethodNotAllowed", f"{method} of an object")
    return handlers[method]


def _bucket_route(method: str, q: web.MultiDictProxy[str]) -> Handler:  # type: ignore[type-arg]
    if method == "GET":
        if "location" in q:
            return buckets.get_location
        if "uploads" in q:
            return multipart("list_uploads")
        for sub in ("versioning", "acl", "policy", "lifecycle", "cors", "tagging",
                    "encryption", "object-lock", "replication", "website", "logging",
                    "notification", "versions", "accelerate", "requestPayment",
                    "ownershipControls", "publicAccessBlock"):
            if sub in q:
                raise S3Error("NotImplemented", f"?{sub} is not supported")
        return listing.list_objects
    if method == "POST" and "delete" in q:
        return objects.delete_objects
    handlers: dict[str, Handler] = {"PUT": buckets.create_bucket,
                                    "DELETE": buckets.delete_bucket,
                                    "HEAD": buckets.head_bucket}
    if method not in handlers:
        raise S3Error("MethodNotAllowed", f"{method} of a bucket")
    return handlers[method]


async def handle(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    request_id = secrets.token_hex(8).upper()
    target = Target()
    try:
        target = locate(request.host, request.raw_path, gateway.domain)
        principal = await gateway.authenticator.authenticate(request)
        syntax.check(request)
        ctx = S3Context(request, gateway, principal, gateway.client(principal.token),
                        target.bucket, target.key, request_id)
        response = await route(ctx)(ctx)
    except S3Error as exc:
        response = _error(exc, request, target, request_id)
    except StagerError as exc:
        response = _error(from_stager(exc), request, target, request_id)
    except web.HTTPException as exc:    # aiohttp's own refusals (a body over its limit)
        code = "EntityTooLarge" if exc.status == 413 else "InvalidRequest"
        response = _error(S3Error(code, exc.reason, status=400 if exc.status == 413
                                  else exc.status), request, target, request_id)
    except ConnectionResetError:
        if request.transport is not None and not request.transport.is_closing():
            raise                       # a read failed mid-answer: the connection is cut
        # The client went away mid-request (its body cut short): the write was aborted
        # and there is no one to answer; no fault of ours, so no traceback in the log.
        log.info("S3 %s %s: the client closed the connection mid-request", request.method,
                 request.path)
        response = _error(S3Error("IncompleteBody", "the connection closed mid-request"),
                          request, target, request_id)
    except Exception as exc:        # a fault of ours: logged, answered as S3 does
        log.exception("S3 %s %s failed", request.method, request.path)
        response = _error(S3Error("InternalError", f"{type(exc).__name__}"), request, target,
                          request_id)
    if not response.prepared:
        response.headers["x-amz-request-id"] = request_id
        response.headers["x-amz-id-2"] = request_id
    return response


def _error(exc: S3Error, request: web.Request, target: Target,
           request_id: str) -> web.Response:
    if exc.code == "NoSuchKey" and target.bucket and not target.key:
        exc = S3Error("NoSuchBucket", exc.message)     # a stager not_found of a bucket
    if not exc.resource:
        exc.resource = request.path
    headers = {"Content-Type": "application/xml", **exc.headers}
    body = b"" if request.method == "HEAD" else exc.xml(request_id)
    return web.Response(status=exc.status, body=body, headers=headers)


def _parse_error(exc: HttpProcessingError, status: int) -> web.Response:
    """S3's XML error, with a request id, for a request aiohttp's parser refused (its
    path may not even be known: no resource)."""
    request_id = secrets.token_hex(8).upper()
    return web.Response(status=status, body=from_parser(exc).xml(request_id), headers={
        "Content-Type": "application/xml", "x-amz-request-id": request_id,
        "x-amz-id-2": request_id})


def make_s3_app(meta_url: str, config: Config, *, domain: str = "",
                authenticator: Authenticator | None = None) -> web.Application:
    """The gateway over the cluster at ``meta_url``."""
    app = web.Application(client_max_size=1 << 21)
    gateway = Gateway(meta_url, config, domain=domain, authenticator=authenticator)
    app[GATEWAY] = gateway

    async def lifetime(app: web.Application):  # type: ignore[no-untyped-def]
        keep_freed_memory()     # this process's buffers reused, not new pages (.memory)
        yield
        await gateway.close()

    app.cleanup_ctx.append(lifetime)
    app[PARSE_ERRORS] = _parse_error
    # [\s\S]: "." stops at a newline, and aiohttp matches the decoded path, so a key
    # with %0A met aiohttp's plain-text 404 instead of this gateway's S3 answer
    app.router.add_route("*", "/{tail:[\\s\\S]*}", handle)
    return app
