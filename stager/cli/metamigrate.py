"""``stager meta migrate --from STORE --to STORE``: copy a namespace between stores.

``STORE`` is ``sqlite:PATH`` (a ``meta.sqlite3``, or a metadata server's ROOT) or
``postgresql://USER@HOST:PORT/DB``.  A ``--from`` a metadata server is serving is
refused (stop it first); ``--to`` must be empty.  What is copied, and what is not
(uploads in progress), is said in :mod:`stager.meta.store.migrate`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # the stores (asyncpg, the metadata service) load when migrating
    from ..meta.store.base import MetaStore
    from ..meta.store.migrate import MigrationReport


async def _run(source_url: str, target_url: str, quiet: bool) -> MigrationReport:
    from ..meta.store.factory import store_at
    from ..meta.store.migrate import migrate

    source: MetaStore = store_at(source_url, must_exist=True)
    try:
        target = store_at(target_url)
        try:
            def say(line: str) -> None:
                if not quiet:
                    print(f"migrate: {line}", file=sys.stderr, flush=True)
            return await migrate(source, target, progress=say)
        finally:
            # Off the loop: the PostgreSQL store then finishes what is under way.
            await asyncio.to_thread(target.close)
    finally:
        await asyncio.to_thread(source.close)


def run_migrate(args: argparse.Namespace) -> int:
    report = asyncio.run(_run(args.source, args.target, args.json))
    if args.json:
        print(json.dumps(report.to_json()))
        return 0
    r = report
    print(f"copied {r.directories} directories, {r.files} files ({r.bytes} bytes), "
          f"{r.manifests} manifests, {r.targets} targets, {r.tokens} tokens, "
          f"{r.garbage} files waiting to be purged")
    if r.uploads_dropped:
        print(f"not copied: {r.uploads_dropped} uploads in progress (their chunks will be "
              "purged by the new metadata server)")
    if r.multipart_uploads:
        print(f"copied: {r.multipart_uploads} S3 multipart uploads in progress (their "
              "clients complete them on the new store)")
    return 0


def register(meta: argparse.ArgumentParser) -> None:
    """``migrate`` under ``stager meta`` (which, without it, runs a metadata server)."""
    sub = meta.add_subparsers(dest="meta_command", metavar="migrate")
    p = sub.add_parser("migrate", help="copy a whole namespace from one metadata store "
                                       "to another (refused while a metadata server "
                                       "serves it)")
    p.add_argument("--from", dest="source", required=True, metavar="STORE",
                   help="sqlite:PATH (meta.sqlite3 or a metadata server's ROOT) or "
                        "postgresql://USER@HOST:PORT/DB")
    p.add_argument("--to", dest="target", required=True, metavar="STORE",
                   help="an empty store, the same forms")
    p.add_argument("--json", action="store_true", help="print the counts as JSON, no progress")
    p.set_defaults(func=run_migrate)
