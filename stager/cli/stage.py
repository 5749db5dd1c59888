"""``stager stage SRC DST``: stage a dataset in from any fsspec URL, or results back out."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any

from ..config import parse_size
from ..errors import BadRequest
from .filecmds import add_layout_flags, layout_spec
from .main import meta_url

if TYPE_CHECKING:   # the staging code and the client load when a command stages
    from ..stage import StageOptions, StageReport


def cluster_of(args: argparse.Namespace) -> str:
    """The cluster a ``stager://HOST:PORT/…`` argument names, else ``--meta``/the default."""
    from ..stage import stager_url

    for url, bare in ((args.dst, True), (args.src, False)):
        named = stager_url(url, bare_is_stager=bare)
        if named is not None and named[0] is not None:
            return named[0]
    return meta_url(args)


def storage_options(pairs: list[str]) -> dict[str, Any]:
    """``-o key=value`` pairs; a value that parses as JSON is taken as such (``anon=true``)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BadRequest(f"a storage option is KEY=VALUE, not {pair!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def options_of(args: argparse.Namespace) -> StageOptions:
    from ..stage import StageOptions

    progress = {"auto": None, "always": True, "never": False}[args.progress]
    return StageOptions(
        include=tuple(args.include), exclude=tuple(args.exclude), layout=layout_spec(args),
        small_files_in_flight=args.files, large_files_in_flight=args.large_files,
        part_size=parse_size(args.part_size), resume=not args.no_resume,
        manifest=not args.no_manifest, progress=progress,
        storage_options=storage_options(args.option))


def cmd_stage(args: argparse.Namespace) -> int:
    from ..client import AsyncClient
    from ..stage import stage

    options = options_of(args)

    async def run() -> StageReport:
        async with AsyncClient(cluster_of(args)) as client:
            return await stage(client, args.src, args.dst, options)

    report = asyncio.run(run())
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    print(f"{report.source} -> {report.destination}: {report.summary()}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "stage", help="stage a dataset in from any fsspec URL (or out to one)",
        description="Copy SRC (any fsspec URL: file://, http(s)://, memory://, s3://, gs://; "
                    "a bare path is local) into the stager path DST, in parallel and "
                    "resumably, and record a dataset manifest: the files below a directory "
                    "SRC land below DST at the same relative paths; a file SRC becomes DST "
                    "(or DST/NAME when DST is a directory or ends in /).  A rerun skips files "
                    "already staged unchanged.  With SRC a stager:// URL and DST any other "
                    "URL, copy results back out.")
    p.add_argument("src", help="source URL")
    p.add_argument("dst", help="destination: a stager path (or stager://HOST:PORT/path), "
                               "or any fsspec URL when SRC is stager://")
    p.add_argument("--include", action="append", default=[], metavar="GLOB",
                   help="stage only files matching (a name glob, or a path glob with '/'); "
                        "repeatable")
    p.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                   help="skip files matching; repeatable")
    add_layout_flags(p)
    p.add_argument("--files", type=int, default=64, help="small files in flight (default 64)")
    p.add_argument("--large-files", type=int, default=4,
                   help="large files in flight, each read in parallel ranges (default 4)")
    p.add_argument("--part-size", default="4MiB",
                   help="bytes per ranged read of a large file, rounded to whole chunks "
                   "(default 4MiB)")
    p.add_argument("--no-resume", action="store_true",
                   help="copy every file, even those already staged unchanged")
    p.add_argument("--no-manifest", action="store_true", help="do not record a manifest")
    p.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                   help="progress bar: on a terminal (auto), always or never")
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="an fsspec storage option of the non-stager side (e.g. anon=true, "
                        "endpoint_url=http://…); repeatable")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_stage)
