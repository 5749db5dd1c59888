"""File commands: put, get, cat, ls, stat, rm, mkdir, mv, setstripe, status."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..config import parse_size
from ..protocol.models import FileInfo, LayoutSpec
from .main import meta_url

if TYPE_CHECKING:   # the client loads when a command talks to a cluster
    from ..client import AsyncClient

T = TypeVar("T")


def with_client(args: argparse.Namespace, fn: Callable[[AsyncClient], Awaitable[T]]) -> T:
    from ..client import AsyncClient

    async def main() -> T:
        async with AsyncClient(meta_url(args)) as client:
            return await fn(client)
    return asyncio.run(main())


def layout_spec(args: argparse.Namespace) -> LayoutSpec | None:
    spec = LayoutSpec(
        chunk_size=parse_size(args.chunk_size) if args.chunk_size else None,
        stripe_count=args.stripe_count, replicas=args.replicas)
    return spec if spec.to_json() else None


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def cmd_put(args: argparse.Namespace) -> int:
    async def run(c: AsyncClient) -> list[FileInfo]:
        src, layout = Path(args.src), layout_spec(args)
        if src.is_dir():
            return await c.put(src, args.dst, layout=layout)
        # `put a.bin /dir/` and `put a.bin /existing-dir` mean /dir/a.bin.  Found by
        # trying, not by a stat first: a write-only token may create, not look.
        if args.dst.endswith("/"):
            return await c.put(src, args.dst + src.name, layout=layout)
        try:
            return await c.put(src, args.dst, layout=layout)
        except IsADirectoryError:
            return await c.put(src, args.dst + "/" + src.name, layout=layout)

    start = time.perf_counter()
    infos = with_client(args, run)
    total = sum(i.size for i in infos)
    secs = time.perf_counter() - start
    print(f"put {len(infos)} file(s), {human(total)} in {secs:.2f}s "
          f"({human(total / secs if secs else 0)}/s)", file=sys.stderr)
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    dst = Path(args.dst)
    if dst.is_dir():
        dst = dst / Path(args.src).name
    start = time.perf_counter()
    total = with_client(args, lambda c: c.get(args.src, dst))
    secs = time.perf_counter() - start
    print(f"got {human(total)} in {secs:.2f}s ({human(total / secs if secs else 0)}/s)",
          file=sys.stderr)
    return 0


def cmd_cat(args: argparse.Namespace) -> int:
    out = sys.stdout.buffer

    async def run(c: AsyncClient) -> None:
        for path in args.paths:
            info = await c.stat(path, cached=False)
            async for piece in c.reader(info).stream():
                out.write(piece)
        out.flush()

    with_client(args, run)
    return 0


def _ls_line(e: FileInfo) -> str:
    kind = "d" if e.is_dir else "-"
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.mtime))
    name = e.name + ("/" if e.is_dir else "")
    return f"{kind} {e.size:>14} {when} {name}"


def cmd_ls(args: argparse.Namespace) -> int:
    async def run(c: AsyncClient) -> None:
        info = await c.stat(args.path, cached=False)
        entries = [info] if not info.is_dir else None
        if args.json:
            if entries is None:
                entries = await c.ls(args.path)
            print(json.dumps([e.to_json() for e in entries], indent=2))
            return
        if entries is not None:
            print(_ls_line(info))
            return
        async for entry in c.iter_dir(args.path):   # page by page: huge dirs stream
            print(_ls_line(entry) if args.long else entry.name + ("/" if entry.is_dir else ""))

    with_client(args, run)
    return 0


def cmd_stat(args: argparse.Namespace) -> int:
    info = with_client(args, lambda c: c.stat(args.path, cached=False))
    body = info.to_json()
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    print(f"  path: {info.path}\n  type: {info.type}\n  size: {info.size} ({human(info.size)})")
    print(f" mtime: {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(info.mtime))}")
    if info.layout is not None:
        lay = info.layout
        print(f"layout: chunk_size={lay.chunk_size} stripe_count={lay.stripe_count} "
              f"replicas={lay.replicas}")
        for i, (t, n) in enumerate(zip(lay.targets, lay.nodes, strict=True)):
            print(f"        [{i}] {t} on {n} at {info.locations.get(t, '?')}")
    if info.default_layout is not None:
        print(f"default layout: {info.default_layout.to_json()}")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    async def run(c: AsyncClient) -> int:
        return sum([await c.rm(p, recursive=args.recursive) for p in args.paths])
    with_client(args, run)
    return 0


def cmd_mkdir(args: argparse.Namespace) -> int:
    async def run(c: AsyncClient) -> None:
        for p in args.paths:
            await c.mkdir(p, parents=args.parents, exist_ok=args.parents,
                          layout=layout_spec(args))
    with_client(args, run)
    return 0


def cmd_mv(args: argparse.Namespace) -> int:
    with_client(args, lambda c: c.rename(args.src, args.dst, overwrite=args.force))
    return 0


def cmd_setstripe(args: argparse.Namespace) -> int:
    spec = layout_spec(args)
    if spec is None:
        info = with_client(args, lambda c: c.stat(args.path, cached=False))
        print(json.dumps((info.default_layout or LayoutSpec()).to_json()))
        return 0
    with_client(args, lambda c: c.set_layout(args.path, spec))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    status = with_client(args, lambda c: c.status())
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    print_status(status)
    return 0


def print_status(status: dict[str, Any]) -> None:
    targets = status["targets"]
    print(f"{status['targets_up']}/{len(targets)} targets up on {status['nodes']} node(s); "
          f"{status['files']} files, {human(status['bytes'])}; "
          f"used {human(status['used'])} of {human(status['capacity'])}")
    print(f"{'target':<16} {'node':<10} {'state':<7} {'used':>10} {'capacity':>10} "
          f"{'chunks':>8}  url")
    now = time.time()
    lost_at = status.get("lost_at", {})
    for t in targets:
        age = now - t["last_heartbeat"]
        lost = (f"; lost in {max(0.0, lost_at[t['id']] - now):.0f}s"
                if t["id"] in lost_at else "")
        print(f"{t['id']:<16} {t['node']:<10} {t['state']:<7} {human(t['used']):>10} "
              f"{human(t['capacity']):>10} {t['chunks']:>8}  {t['url']}  "
              f"(seen {age:.0f}s ago{lost})")
    from .admin import print_metas, print_reliability
    from .cachecmds import print_attachments
    from .quotacmds import print_quotas

    print_metas(status)
    print_reliability(status)
    print_attachments(status)
    print_quotas(status)


def add_layout_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chunk-size", help="bytes per chunk, e.g. 4MiB")
    p.add_argument("--stripe-count", type=int, help="targets to stripe over (0 = all)")
    p.add_argument("--replicas", type=int, help="copies of each chunk on distinct nodes")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("put", help="copy a local file or directory in")
    p.add_argument("src")
    p.add_argument("dst")
    add_layout_flags(p)
    p.set_defaults(func=cmd_put)

    p = sub.add_parser("get", help="copy a file or directory out")
    p.add_argument("src")
    p.add_argument("dst")
    p.set_defaults(func=cmd_get)

    p = sub.add_parser("cat", help="write files to standard output")
    p.add_argument("paths", nargs="+")
    p.set_defaults(func=cmd_cat)

    p = sub.add_parser("ls", help="list a directory")
    p.add_argument("path", nargs="?", default="/")
    p.add_argument("-l", "--long", action="store_true", help="type, size and mtime")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("stat", help="size, times and layout of a path")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="everything, layout included, as JSON")
    p.set_defaults(func=cmd_stat)

    p = sub.add_parser("rm", help="delete files or directories")
    p.add_argument("paths", nargs="+")
    p.add_argument("-r", "--recursive", action="store_true")
    p.set_defaults(func=cmd_rm)

    p = sub.add_parser("mkdir", help="make directories (with a default layout)")
    p.add_argument("paths", nargs="+")
    p.add_argument("-p", "--parents", action="store_true")
    add_layout_flags(p)
    p.set_defaults(func=cmd_mkdir)

    p = sub.add_parser("mv", help="rename a file or directory")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("-f", "--force", action="store_true", help="replace an existing file")
    p.set_defaults(func=cmd_mv)

    p = sub.add_parser("setstripe", help="show or set a directory's default layout")
    p.add_argument("path")
    add_layout_flags(p)
    p.set_defaults(func=cmd_setstripe)

    p = sub.add_parser("status", help="targets, nodes, capacity, health")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)


