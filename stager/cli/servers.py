"""``stager meta`` and ``stager data``: one server each, for real deployments."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from ..config import Config, load_config
from ..errors import BadRequest
from . import metamigrate

# The server's code (aiohttp's web side, the metadata service, the data service) is
# imported by the command that runs it: a data server never loads the metadata
# server's, and other commands load neither.


def add_server_flags(p: argparse.ArgumentParser, default_port: int) -> None:
    p.add_argument("--root", help="state directory (default: ./.stager)")
    p.add_argument("--host", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=None,
                   help=f"port (default: {default_port}; 0 picks a free one)")
    p.add_argument("--advertise-url", help="URL others use to reach this server")
    p.add_argument("--config", help="TOML configuration file")
    p.add_argument("--ready-file", help="write {url, pid} here once listening "
                                        "(default: ROOT/server.json)")
    p.add_argument("--event-loop", choices=("auto", "uvloop", "asyncio"))
    p.add_argument("--auth", action="store_true", default=None,
                   help="require tokens (metadata server) or capabilities (data server)")
    p.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate "
                                                     "(chain); needs --tls-key")
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    p.add_argument("--insecure", action="store_true", default=None,
                   help="serve a non-loopback address without --auth (anyone who reaches "
                        "the port may do anything)")


def server_config(args: argparse.Namespace, default_port: int, **extra: Any) -> Config:
    from ..web.server import refuse_exposed

    flags = {"root": args.root, "host": args.host, "advertise_url": args.advertise_url,
             "port": args.port, "event_loop": args.event_loop, "auth": args.auth,
             "insecure": args.insecure, "tls_cert": args.tls_cert, "tls_key": args.tls_key,
             **extra}
    config = load_config(flags, path=args.config, defaults={"port": default_port})
    refuse_exposed(config)
    return config


def _ready_file(args: argparse.Namespace, config: Config) -> Path:
    return Path(args.ready_file) if args.ready_file else Path(config.root) / "server.json"


def run_meta(args: argparse.Namespace) -> int:
    from ..meta.http.app import make_meta_app
    from ..meta.presence import announcer
    from ..web.server import run, serve

    config = server_config(args, 7070, chunk_size=args.chunk_size,
                           cache_limit=args.cache_limit,
                           stripe_count=args.stripe_count, replicas=args.replicas,
                           auth_dir=args.auth_dir, admin_token_file=args.admin_token_file,
                           meta_store=args.store)

    async def main() -> None:
        app = make_meta_app(config)
        await serve(app, config, after_bind=announcer(app),
                    ready_file=_ready_file(args, config))

    run(main(), "uvloop" if config.event_loop == "auto" else config.event_loop)
    return 0


def run_data(args: argparse.Namespace) -> int:
    from ..data.app import SERVICE, make_data_app
    from ..data.registration import leave, register_and_heartbeat
    from ..web.authmw import GATE
    from ..web.server import run, serve

    # --meta as a flag; else the usual layers: STAGER_META_URL, the file's meta_url (a
    # systemd unit's /etc/stager/stager.toml), the default
    config = server_config(args, 0, meta_url=args.meta, node=args.node,
                           target_id=args.target_id, capacity=args.capacity,
                           public_key_file=args.public_key)
    if config.auth and config.bearer_token() is None:
        raise BadRequest("a data server with --auth joins with a token of the join scope "
                         "(`stager token create --scope join`): give it with --token-file, "
                         "STAGER_TOKEN_FILE or STAGER_TOKEN")

    async def main() -> None:
        app = make_data_app(config)

        async def announce(url: str) -> None:
            try:
                await register_and_heartbeat(app[SERVICE], config, url, app.get(GATE))
            except asyncio.CancelledError:
                # Stopping (SIGTERM: a pod's preStop, `docker stop`), still serving:
                # the metadata server marks the target down now, not after a timeout.
                await leave(app[SERVICE], config)
                raise

        await serve(app, config, after_bind=announce, ready_file=_ready_file(args, config))

    # The stock asyncio loop has a zero-copy sendfile; uvloop does not.
    run(main(), "asyncio" if config.event_loop == "auto" else config.event_loop)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("meta", help="run one metadata server")
    add_server_flags(p, 7070)
    p.add_argument("--chunk-size", help="default chunk size (e.g. 4MiB)")
    p.add_argument("--cache-limit", metavar="BYTES",
                   help="keep filled (re-fetchable) bytes of attached directories under "
                        "this (e.g. 2GiB; default: no limit)")
    p.add_argument("--stripe-count", type=int, help="default stripe count (0 = all, max 8)")
    p.add_argument("--replicas", type=int, help="default replicas")
    p.add_argument("--store", help="where the namespace lives: postgresql://USER@HOST:PORT/DB "
                                   "(default: SQLite under ROOT; also STAGER_META_STORE)")
    p.add_argument("--auth-dir", help="with --auth: where the signing key is kept "
                                      "(default: ROOT/auth)")
    p.add_argument("--admin-token-file", help="with --auth: where the first admin token is "
                                              "written (default: ROOT/admin.token)")
    p.set_defaults(func=run_meta)
    metamigrate.register(p)

    p = sub.add_parser("data", help="run one data server (one storage target)")
    add_server_flags(p, 0)
    p.add_argument("--node", help="node name (default: the host name)")
    p.add_argument("--target-id", help="stable target id (default: generated once, kept)")
    p.add_argument("--capacity", help="bytes to offer (default: the file system's size)")
    p.add_argument("--public-key", help="with --auth: the metadata server's public key "
                                        "(a file; default: asked of the metadata server)")
    p.set_defaults(func=run_data)
