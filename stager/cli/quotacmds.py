"""``stager quota set|list|rm`` and ``stager pin`` / ``stager unpin`` (stager/meta/quotas.py)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ..config import parse_size
from .filecmds import human, with_client


def _limit(value: int | None, show: Any = str) -> str:
    return "-" if value is None else str(show(value))


def quota_line(q: dict[str, Any]) -> str:
    """One quota as ``stager quota list`` and ``stager status`` print it."""
    return (f"{q['path']:<24} {human(q['used_bytes']):>10} of {_limit(q['bytes'], human):>10}"
            f"  {q['used_files']:>8} of {_limit(q['files']):>8} files")


def pin_line(p: dict[str, Any]) -> str:
    until = ("until unpinned" if p["expires"] is None else
             f"until {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(p['expires']))}")
    return f"{p['path']:<24} {until}"


def print_quotas(status: dict[str, Any]) -> None:
    """The quota and pin lines of ``stager status``."""
    for q in status.get("quotas", []):
        print("quota " + quota_line(q))
    for p in status.get("pins", []):
        print("pin   " + pin_line(p))


def cmd_quota_set(args: argparse.Namespace) -> int:
    files = int(args.files) if args.files is not None else None
    quota = with_client(args, lambda c: c.set_quota(args.path, max_bytes=parse_size(args.bytes),
                                                    max_files=files))
    print(quota_line(quota.to_json()))
    return 0


def cmd_quota_rm(args: argparse.Namespace) -> int:
    quota = with_client(args, lambda c: c.set_quota(args.path))
    print(f"{quota.path}: no quota ({human(quota.used_bytes)} in {quota.used_files} files)")
    return 0


def cmd_quota_list(args: argparse.Namespace) -> int:
    quotas = [q.to_json() for q in with_client(args, lambda c: c.quotas())]
    if args.json:
        print(json.dumps(quotas, indent=2))
        return 0
    print(f"{'path':<24} {'used':>10}    {'bytes':>10}  {'used':>8}    {'files':>8}")
    for q in quotas:
        print(quota_line(q))
    return 0


def cmd_pin(args: argparse.Namespace) -> int:
    if args.list:
        for p in with_client(args, lambda c: c.pins()):
            print(pin_line(p.to_json()))
        return 0
    if args.path is None:
        raise ValueError("stager pin: a PATH, or --list")
    pinned = with_client(args, lambda c: c.pin(args.path, ttl=args.ttl))
    print("pinned " + pin_line(pinned.to_json()))
    return 0


def cmd_unpin(args: argparse.Namespace) -> int:
    with_client(args, lambda c: c.unpin(args.path))
    print(f"unpinned {args.path}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("quota", help="directory quotas: a write past one fails with 507 "
                                     "quota_exceeded")
    qsub = p.add_subparsers(dest="quota_command", metavar="ACTION", required=True)
    s = qsub.add_parser("set", help="set a directory's quota (admin); its use is counted now")
    s.add_argument("path")
    s.add_argument("--bytes", required=True, help="bytes at most (e.g. 10GiB)")
    s.add_argument("--files", type=int, help="files at most")
    s.set_defaults(func=cmd_quota_set)
    r = qsub.add_parser("rm", help="drop a directory's quota (admin)")
    r.add_argument("path")
    r.set_defaults(func=cmd_quota_rm)
    ls = qsub.add_parser("list", help="every quota with its use")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_quota_list)

    p = sub.add_parser("pin", help="pin a file or directory: never evicted from the fast "
                                   "tier until unpinned or its ttl ends")
    p.add_argument("path", nargs="?")
    p.add_argument("--ttl", type=float, metavar="SECONDS", help="the pin ends after this")
    p.add_argument("--list", action="store_true", help="list the pins alive")
    p.set_defaults(func=cmd_pin)
    u = sub.add_parser("unpin", help="drop a pin")
    u.add_argument("path")
    u.set_defaults(func=cmd_unpin)
