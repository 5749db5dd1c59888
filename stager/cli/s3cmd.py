"""``stager s3``: an S3-compatible gateway over a cluster (docs/s3.md).

It is a client of the cluster (``--meta``), so as many as wanted can run, behind
any load balancer.  ``--s3-domain D`` adds virtual-hosted-style addressing
(``BUCKET.D``) to path-style.  ``--ready-file`` gets ``{url, pid}`` once it
listens (``stager up --s3-port`` reads the real port back from it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import load_config
from .main import meta_url


def run_s3(args: argparse.Namespace) -> int:
    from ..s3.app import make_s3_app
    from ..s3.auth import Authenticator
    from ..web.server import refuse_exposed, run, serve

    config = load_config({"host": args.host, "port": args.port, "auth": args.auth or None,
                          "insecure": args.insecure or None, "tls_cert": args.tls_cert,
                          "tls_key": args.tls_key}, defaults={"port": 9000})
    refuse_exposed(config)
    url = meta_url(args)

    async def main() -> None:
        app = make_s3_app(url, config, domain=args.s3_domain or "",
                          authenticator=Authenticator(required=bool(config.auth),
                                                      meta_url=url, config=config))
        await serve(app, config, ready_file=Path(args.ready_file) if args.ready_file else None)

    run(main(), "uvloop" if config.event_loop == "auto" else config.event_loop)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("s3", help="run an S3-compatible gateway over the cluster")
    # also accepted after the command (stager s3 --meta URL): the global flag's dest
    p.add_argument("--meta", metavar="URL[,URL…]", default=argparse.SUPPRESS,
                   help="the cluster's metadata server(s) (default: $STAGER_META_URL)")
    p.add_argument("--host", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=None,
                   help="port (default: 9000; 0 picks a free one)")
    p.add_argument("--s3-domain", metavar="DOMAIN",
                   help="also answer virtual-hosted-style requests to BUCKET.DOMAIN")
    p.add_argument("--auth", action="store_true",
                   help="require AWS Signature V4 with keys of `stager token create --s3`")
    p.add_argument("--insecure", action="store_true",
                   help="serve a non-loopback address without --auth")
    p.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate")
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    p.add_argument("--ready-file", help="write {url, pid} here once listening")
    p.set_defaults(func=run_s3)
