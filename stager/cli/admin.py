"""Operator commands: ``stager target remove|forget``, ``stager scrub``, ``stager fsck``."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ..config import parse_size
from .filecmds import human, with_client


def cmd_target_remove(args: argparse.Namespace) -> int:
    target = with_client(args, lambda c: c.remove_target(args.target_id))
    print(f"target {target.id} on {target.node} is {target.state}: its chunks are being "
          "re-replicated; `stager status` shows the rebuild")
    return 0


def cmd_target_forget(args: argparse.Namespace) -> int:
    target = with_client(args, lambda c: c.forget_target(args.target_id))
    print(f"target {target.id} on {target.node} forgotten: it leaves the listing and its "
          "credential is revoked")
    return 0


def cmd_scrub(args: argparse.Namespace) -> int:
    rate = parse_size(args.rate) if args.rate else None
    result = with_client(args, lambda c: c.scrub(rate=rate))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for target, r in sorted(result["targets"].items()):
            if "error" in r:
                print(f"{target:<16} unreachable: {r['error']}")
            else:
                print(f"{target:<16} {r['checked']:>8} chunks {human(r['bytes']):>10}  "
                      f"{len(r['corrupt'])} corrupt  ({r['seconds']:.1f}s)")
        print(f"checked {result['checked']} chunks ({human(result['bytes'])}): "
              f"{result['corrupt']} corrupt, {result['repaired']} repaired, "
              f"{result['unrecoverable']} unrecoverable, {result['deferred']} deferred")
    bad = result["unrecoverable"] or result["deferred"] or result["unreachable"]
    return 1 if bad else 0


def cmd_fsck(args: argparse.Namespace) -> int:
    result = with_client(args, lambda c: c.fsck(repair=args.repair))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0 if result["clean"] else 1
    print(f"{result['files']} files, {result['chunks_expected']} chunk copies expected, "
          f"{result['chunks_found']} found")
    print(f"missing: {result['missing']} ({result['repaired']} repaired)")
    for m in result["missing_list"]:
        print(f"  {m['chunk']} on {m['target']}  ({m.get('path') or m['file_id']})")
    print(f"orphans: {result['orphans']} ({result['orphans_deleted']} deleted)")
    if result["unreachable"]:
        print(f"not checked (down or unreachable): {', '.join(result['unreachable'])}")
    if result["under_replicated"]:
        print(f"under-replicated files (on lost targets): {result['under_replicated']}")
    print("clean" if result["clean"] else "NOT clean")
    return 0 if result["clean"] else 1


def print_metas(status: dict[str, Any]) -> None:
    """The metadata servers of ``stager status``: one a line, and a warning when
    one is down (with two of them, one dead, the rest looks healthy)."""
    metas = status.get("metas", [])
    down = [m for m in metas if m["state"] != "up"]
    print(f"{len(metas) - len(down)}/{len(metas)} metadata servers up"
          + (f"; DOWN: {', '.join(m['url'] for m in down)}" if down else ""))
    now = time.time()
    for m in metas:
        duties = "duties" if m["duties"] else "-"
        print(f"  {m['url']:<30} {m['state']:<5} {duties:<7} {m['store']}  "
              f"(seen {max(0.0, now - m['last_seen']):.0f}s ago)")


def print_reliability(status: dict[str, Any]) -> None:
    """The rebuild, repair and fsck lines of ``stager status``."""
    now = time.time()
    for target, at in sorted(status.get("lost_at", {}).items(), key=lambda kv: kv[1]):
        print(f"target {target} is down: declared lost in {max(0.0, at - now):.0f}s "
              f"(at {time.strftime('%H:%M:%S', time.localtime(at))}), then its chunks "
              "are re-replicated")
    rb = status.get("rebuild")
    if rb and (rb["state"] != "idle" or rb["passes"]):
        print(f"rebuild: {rb['state']}; lost {', '.join(rb['lost']) or '-'}; "
              f"{rb['files_done']}/{rb['files_total']} files, "
              f"{human(rb['bytes_copied'])} copied, {human(rb['bytes_remaining'])} remaining "
              f"({human(rb['rate'])}/s); {rb['files_deferred']} deferred, "
              f"{rb['unrecoverable_count']} unrecoverable")
    rp = status.get("repair")
    if rp and rp["reported"]:
        print(f"repair: {rp['reported']} corrupt copies reported, {rp['repaired']} repaired, "
              f"{rp['unrecoverable']} unrecoverable, {rp['pending']} pending")
    fs = status.get("fsck")
    if fs:
        ago = time.time() - fs["finished"]
        print(f"fsck ({ago:.0f}s ago): {'clean' if fs['clean'] else 'NOT clean'}; "
              f"{fs['missing']} missing, {fs['orphans']} orphans")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("target", help="storage target administration")
    tsub = p.add_subparsers(dest="target_command", metavar="ACTION", required=True)
    r = tsub.add_parser("remove", help="declare a target lost: re-replicate its chunks")
    r.add_argument("target_id")
    r.set_defaults(func=cmd_target_remove)
    f = tsub.add_parser("forget", help="drop a lost or removed target once its chunks are "
                        "copied elsewhere: it leaves the listing, its capacity stops counting")
    f.add_argument("target_id")
    f.set_defaults(func=cmd_target_forget)

    p = sub.add_parser("scrub", help="verify every chunk's checksums now; repair bad copies")
    p.add_argument("--rate", help="bytes/s per target, at least 64KiB "
                                  "(e.g. 200MiB; default: no limit)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_scrub)

    p = sub.add_parser("fsck", help="check the namespace against the chunks on the targets")
    p.add_argument("--repair", action="store_true",
                   help="copy missing chunks from replicas; delete orphans past the grace")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_fsck)
