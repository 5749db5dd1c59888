"""Building and running a stager server: common routes, binding, signals."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import signal
import socket
import ssl
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from ..aio import loop_factory
from ..auth.tls import server_context, tls_pair
from ..config import Config
from ..errors import BadRequest
from ..protocol.messages import Health
from ..protocol.openapi import openapi_document
from ..protocol.routes import routes_for
from ..version import __version__
from .authmw import CAPABILITY_HEADER_BYTES
from .metrics import ServerMetrics
from .middleware import METRICS_KEY, MIDDLEWARES, encode_json, json_response
from .parseerrors import Runner

log = logging.getLogger("stager.server")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def base_app(role: str, *, client_max_size: int, identity: Mapping[str, str],
             refresh_metrics: Callable[[ServerMetrics], Awaitable[None]] | None = None,
             ) -> web.Application:
    """An application with the middlewares and the routes every server has; ``identity``
    is what its health answer names besides role and version (a target's ``id``, ``node``)."""
    app = web.Application(middlewares=MIDDLEWARES, client_max_size=client_max_size)
    app[METRICS_KEY] = ServerMetrics(role)
    document = openapi_document(role)

    # The answer never changes while the server runs: encoded once.
    healthy = encode_json(Health(role, __version__, **identity).to_json())

    async def health(request: web.Request) -> web.Response:
        return web.Response(body=healthy, content_type="application/json")

    async def openapi(request: web.Request) -> web.Response:
        return json_response(document)

    async def metrics(request: web.Request) -> web.Response:
        if refresh_metrics is not None:
            await refresh_metrics(request.app[METRICS_KEY])
        return web.Response(body=request.app[METRICS_KEY].render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    common = {"health": health, "openapi": openapi, "metrics": metrics}
    for route in routes_for("common"):
        if route.role == "common":
            app.router.add_route(route.method, route.path, common[route.op], name=route.op)
    return app


def add_routes(app: web.Application, role: str, handlers: Mapping[str, Handler]) -> None:
    """Register ``handlers[op]`` for every route of ``role`` in the route table."""
    for route in routes_for(role):
        if route.role == "common":
            continue
        app.router.add_route(route.method, route.path, handlers[route.op], name=route.op)


async def serve(
    app: web.Application,
    config: Config,
    *,
    after_bind: Callable[[str], Coroutine[Any, Any, None]] | None = None,
    ready_file: str | os.PathLike[str] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve ``app`` on ``config.host:config.port`` until ``stop`` is set or a signal comes;
    over HTTPS when ``config`` names a TLS certificate and key."""
    tls = ssl_context_of(config)
    # (parse errors answered in the app's own format: stager/web/parseerrors.py)
    runner = Runner(app, access_log=None, handle_signals=False,
                    shutdown_timeout=5.0, max_field_size=MAX_HEADER_FIELD)
    await runner.setup()
    listening = await start_sites(runner, config.host, config.port, ssl_context=tls)
    host, port = _bound_address(runner)
    scheme = "https" if tls else "http"
    url = config.advertise_url or f"{scheme}://{_url_host(config.host, host)}:{port}"
    log.info("listening on %s (advertised %s)", f"{host}:{port}", url)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread (tests run servers in threads)
    background: asyncio.Task[None] | None = None
    try:
        if after_bind is not None:
            background = asyncio.create_task(after_bind(url))
        if ready_file:
            write_json_atomic(Path(ready_file), {"url": url, "pid": os.getpid()})
        await stop.wait()
    finally:
        if background is not None:
            background.cancel()
            await asyncio.gather(background, return_exceptions=True)
        await stop_sites(runner, listening)


BACKLOG = 1024
# A chunk batch of many small files carries a capability for each in one header
# (X-Stager-Capability, up to stager.web.authmw.MAX_CAPABILITIES of up to 276 bytes:
# 1 MiB held 3,956 of the write capabilities minted today, 264 characters each).
MAX_HEADER_FIELD = CAPABILITY_HEADER_BYTES


def ssl_context_of(config: Config) -> ssl.SSLContext | None:
    """The server's TLS context when ``config`` sets ``tls_cert`` and ``tls_key``;
    ``None`` for plain HTTP; :class:`ValueError` when only one is set."""
    pair = tls_pair(config.tls_cert, config.tls_key)
    return server_context(*pair) if pair else None


async def start_sites(runner: web.AppRunner, host: str, port: int, *,
                      ssl_context: ssl.SSLContext | None = None) -> list[socket.socket]:
    """Serve ``runner`` on every address ``host`` names (over TLS with ``ssl_context``);
    the listening sockets, for :func:`stop_sites`."""
    sockets = _listen(host, port)
    for sock in sockets:
        await web.SockSite(runner, sock, backlog=BACKLOG, ssl_context=ssl_context).start()
    return sockets


async def stop_sites(runner: web.AppRunner, sockets: list[socket.socket]) -> None:
    """Stop accepting on ``sockets``, then close every connection and ``runner``."""
    await _stop_accepting(sockets)
    await runner.cleanup()


def _listen(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` names (all of them for ``""``),
    as ``loop.create_server`` binds them, but owned here: see :func:`_stop_accepting`."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


async def _stop_accepting(sockets: list[socket.socket]) -> None:
    """Stop accepting, and let connections already accepted reach the application.

    asyncio (3.11) accepts a connection in one turn of the loop and makes its
    transport in the next; closing the server between the two makes that
    transport fail half-made, its socket left open for the collector to find.
    So the sockets leave the selector first, and the server closes two turns
    later, after aiohttp has seen every connection it must close.
    """
    loop = asyncio.get_running_loop()
    for sock in sockets:
        loop.remove_reader(sock.fileno())
    for _ in range(2):
        await asyncio.sleep(0)


def _bound_address(runner: web.AppRunner) -> tuple[str, int]:
    address = runner.addresses[0]
    return str(address[0]), int(address[1])


def _url_host(configured: str, bound: str) -> str:
    host = configured if configured not in ("0.0.0.0", "::", "") else machine_address()
    return f"[{host}]" if ":" in host else host


def machine_address() -> str:
    """What other machines reach this one by, for a server bound to every address
    with no ``--advertise-url``: the host name when it resolves beyond loopback, else
    the address of the default route's interface; 127.0.0.1 (said in the log) only
    when there is neither, a machine no other can reach anyway."""
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        if infos and not any(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback
                             for i in infos):
            return name
    except OSError:
        pass
    try:
        # UDP connect sends nothing; it picks the source address a packet would use
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))          # TEST-NET-1, never routed anywhere
            address = str(probe.getsockname()[0])
        if not ipaddress.ip_address(address).is_loopback:
            return address
    except OSError:
        pass
    log.warning("bound to every address, but %s resolves only to loopback and there is "
                "no default route: advertising 127.0.0.1 (give --advertise-url)", name)
    return "127.0.0.1"


def refuse_exposed(config: Config) -> None:
    """A server reachable from other machines serves only with auth, unless told
    ``insecure``: a :class:`~stager.errors.BadRequest` saying how, otherwise."""
    if config.auth or config.insecure or is_loopback(config.host):
        return
    where = config.host or "every address"
    raise BadRequest(f"refusing to serve {where} without auth: add --auth (tokens; "
                     "`stager token create`), or --insecure to let anyone who reaches the "
                     "port read, write and delete everything")


def is_loopback(host: str) -> bool:
    """Does ``host`` (an address or a name) reach this machine only?"""
    if not host:
        return False
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback
                               for i in infos)


def write_json_atomic(path: Path, body: object) -> None:
    """Write JSON to ``path`` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    os.replace(tmp, path)


def run(main: Coroutine[Any, Any, None], loop_kind: str = "auto") -> None:
    """Run ``main`` to completion on uvloop (``uvloop``/``auto`` when installed) or asyncio."""
    with asyncio.Runner(loop_factory=loop_factory(loop_kind)) as runner:
        runner.run(main)
