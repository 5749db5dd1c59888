"""``stager attach`` / ``detach`` / ``warm``: the fast tier as a cache of a source URL
(stager/meta/cache/), and the attached directories of ``stager status``.

``stager attach SRC DST`` makes DST a view of SRC: listed from the source, each file's
bytes fetched by the servers on first read and kept.  ``stager attach --refresh DST``
lists the source again; ``stager detach DST`` forgets the view and frees its cached
bytes.  ``stager warm PATH`` reads ahead of a job what it will read, so the job finds
it cached; a second run fetches only what is still missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from ..errors import BadRequest
from .filecmds import human, with_client
from .stage import storage_options

if TYPE_CHECKING:
    from ..client import AsyncClient
    from ..client.warm import WarmResult
    from ..protocol.cache import Refreshed

RELIST = "\0relist"     # `--refresh` given without SECONDS: `attach DST --refresh`
ATTACH_USAGE = ("stager attach SRC DST [--refresh SECONDS] [--include GLOB]… "
                "[--exclude GLOB]… [--option KEY=VALUE]…, or stager attach --refresh DST")


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def attachment_line(a: dict[str, Any]) -> str:
    """One attached directory as ``stager status`` prints it."""
    return (f"{a['path']:<24} {a['source']:<32} {a['files']:>8} "
            f"{human(a['cached_bytes']):>10} of {human(a['bytes']):>10}  "
            f"{ratio(a['hit_ratio']):>6}")


def print_attachments(status: dict[str, Any]) -> None:
    """The "attached" table of ``stager status`` (nothing when none is)."""
    attachments = status.get("attachments", [])
    if not attachments:
        return
    print(f"attached: {len(attachments)} director{'y' if len(attachments) == 1 else 'ies'}")
    print(f"  {'path':<24} {'source':<32} {'files':>8} {'cached':>10}    {'total':>10}  "
          f"{'hits':>6}")
    for a in attachments:
        print("  " + attachment_line(a))


def changes(r: Refreshed) -> str:
    """What a listing found, in words."""
    a = r.attachment
    return (f"{a.files} files, {human(a.bytes)} ({r.added} added, {r.changed} changed, "
            f"{r.removed} removed, {r.unchanged} unchanged); {human(a.cached_bytes)} cached")


def _refresh_seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        raise BadRequest(f"--refresh SECONDS: not a number of seconds: {value!r} (to list "
                         "an attached directory again: stager attach --refresh DST)"
                         ) from None


def cmd_attach(args: argparse.Namespace) -> int:
    where = list(args.paths)
    relist = (not where and args.refresh not in (None, RELIST)) or \
        (len(where) == 1 and args.refresh == RELIST)
    if relist:
        dst = where[0] if where else args.refresh
        if args.include or args.exclude or args.option:
            raise BadRequest("stager attach --refresh DST lists the source again as "
                             "attached: no --include/--exclude/--option")
        result = with_client(args, lambda c: c.refresh(dst))
        verb = "refreshed"
    elif len(where) == 2:
        src, dst = where
        seconds = _refresh_seconds(None if args.refresh == RELIST else args.refresh)
        options = storage_options(args.option)
        result = with_client(args, lambda c: c.attach(
            src, dst, refresh=seconds, include=args.include, exclude=args.exclude,
            options=options))
        verb = "attached"
    else:
        raise BadRequest(f"usage: {ATTACH_USAGE}")
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
        return 0
    a = result.attachment
    print(f"{verb} {a.path} <- {a.source}: {changes(result)}")
    return 0


def cmd_detach(args: argparse.Namespace) -> int:
    gone = with_client(args, lambda c: c.detach(args.dst))
    if args.json:
        print(json.dumps(gone.to_json(), indent=2))
        return 0
    print(f"detached {gone.path}: its view of {gone.files} files forgotten, "
          f"{gone.chunks} cached chunks freed")
    return 0


def warm_summary(path: str, r: WarmResult) -> str:
    """The last line of ``stager warm``: what it fetched, and what was there already."""
    total = r.bytes_fetched + r.bytes_cached_before
    if not r.bytes_fetched:
        return (f"warmed {path}: {r.files} files, {r.chunks} chunks, {human(total)}: all "
                "cached already, nothing fetched")
    return (f"warmed {path}: {r.files} files, {r.chunks} chunks, {human(total)}: fetched "
            f"{human(r.bytes_fetched)}, {human(r.bytes_cached_before)} cached already")


def cmd_warm(args: argparse.Namespace) -> int:
    from ..client.warm import PlanSpec, warm
    from ..stage.progress import make_progress

    plan = PlanSpec.parse(args.plan) if args.plan is not None else None
    if args.parallel < 1:
        raise BadRequest(f"--parallel must be at least 1, not {args.parallel}")
    show = {"auto": None, "always": True, "never": False}[args.progress]

    async def run(client: AsyncClient) -> WarmResult:
        order = None
        if plan is not None:
            from ..loader.warmplan import plan_order

            order = await plan_order(client, args.path, plan)
        bar = make_progress(show, args.path, label=f"warm {args.path}", files=False)
        bar.start(0, 0)
        try:
            return await warm(client, args.path, parallel=args.parallel, order=order,
                              on_bytes=bar.advance, on_total=bar.add_total)
        finally:
            bar.stop()

    result = with_client(args, run)
    if args.json:
        print(json.dumps({"path": args.path, "files": result.files, "chunks": result.chunks,
                          "bytes_fetched": result.bytes_fetched,
                          "bytes_cached_before": result.bytes_cached_before}, indent=2))
    print(warm_summary(args.path, result), file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "attach", help="make a stager directory a cached view of any fsspec URL",
        description="Make the stager directory DST a view of SRC (file://, http(s)://, "
                    "s3://, gs://): listing and stat come from the source, each file's "
                    "bytes are fetched by the servers on first read and kept in the "
                    "striped tier.  `stager attach --refresh DST` lists the source again: "
                    "a changed file's cached bytes are dropped, a vanished one answers 404.",
        usage=ATTACH_USAGE)
    p.add_argument("paths", nargs="*", metavar="SRC DST", help="the source URL and the stager "
                                                               "directory")
    p.add_argument("--refresh", nargs="?", const=RELIST, metavar="SECONDS",
                   help="with SRC DST: list the source again after this many seconds; "
                        "with DST alone: list it again now")
    p.add_argument("--include", action="append", default=[], metavar="GLOB",
                   help="show only files matching (a name glob, or a path glob with '/'); "
                        "repeatable")
    p.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                   help="hide files matching; repeatable")
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="an fsspec storage option of the source (e.g. "
                        "endpoint_url=http://…, anon=true), kept by the servers, encrypted; "
                        "repeatable")
    p.add_argument("--json", action="store_true", help="print what the listing found as JSON")
    p.set_defaults(func=cmd_attach)

    p = sub.add_parser("detach", help="forget an attached directory's view and free its "
                                      "cached bytes (the source is not touched)")
    p.add_argument("dst")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_detach)

    p = sub.add_parser(
        "warm", help="fetch an attached tree into the fast tier ahead of a job",
        description="Fetch every file below PATH that is not cached yet (or, with --plan, "
                    "the files a Loader with that seed, world size and epoch reads, in its "
                    "order), with a progress bar.  Resumable: a second run fetches only what "
                    "is still missing.")
    p.add_argument("path")
    p.add_argument("--parallel", type=int, default=8, help="files fetched at once "
                                                           "(default 8)")
    p.add_argument("--plan", metavar="seed=S,world=W,epoch=E",
                   help="warm what a Loader with these parameters reads, first reads first")
    p.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                   help="progress bar: on a terminal (auto), always or never")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_warm)
