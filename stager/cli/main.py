"""The ``stager`` command: one entry point, one module per group of subcommands.

Each module in :data:`COMMAND_MODULES` has ``register(subparsers)``, which adds
its subcommands and sets ``func`` on each; ``func(args)`` returns the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from ..config import DEFAULT_META_URL
from ..errors import StagerError

COMMAND_MODULES = ("stager.cli.servers", "stager.cli.up", "stager.cli.filecmds",
                   "stager.cli.bench", "stager.cli.mount", "stager.cli.stage",
                   "stager.cli.admin", "stager.cli.jobcmds", "stager.cli.tokencmds",
                   "stager.cli.slurmcmds", "stager.cli.jobup", "stager.cli.quotacmds",
                   "stager.cli.cachecmds", "stager.cli.s3cmd")


def meta_url(args: argparse.Namespace) -> str:
    """``--meta``, else ``STAGER_META_URL``, else the default: one metadata server's URL
    or several, comma-separated (servers on one store; clients fail over in order)."""
    return str(getattr(args, "meta", None) or os.environ.get("STAGER_META_URL")
               or DEFAULT_META_URL)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stager", description="stager: a striped data-staging service for AI training")
    parser.add_argument("--meta", metavar="URL[,URL…]",
                        help="metadata server, or several on one store, comma-separated "
                             "(default: $STAGER_META_URL, else "
                             f"{DEFAULT_META_URL})")
    parser.add_argument("--token-file", metavar="FILE",
                        help="a file holding the token to present (default: $STAGER_TOKEN, "
                             "else $STAGER_TOKEN_FILE)")
    parser.add_argument("--ca", metavar="FILE",
                        help="CA certificate(s) to trust for https:// servers "
                             "(default: $STAGER_CA_FILE, else the system's store)")
    parser.add_argument("--log-level", default=os.environ.get("STAGER_LOG_LEVEL", "WARNING"),
                        help="DEBUG, INFO, WARNING (default) or ERROR")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.token_file:
        # Every client this command makes reads its configuration from the environment,
        # and so do the servers and mounts it starts.
        os.environ["STAGER_TOKEN_FILE"] = args.token_file
        os.environ.pop("STAGER_TOKEN", None)
    if args.ca:
        os.environ["STAGER_CA_FILE"] = args.ca      # the same way, for the same reason
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `stager cat big | head`: the reader went away; not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (StagerError, OSError, ValueError) as exc:
        print(f"stager: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
