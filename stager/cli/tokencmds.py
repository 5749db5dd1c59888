"""``stager token create|list|revoke``: bearer tokens, minted by the metadata server.

Every one needs an admin token (``--token-file ROOT/admin.token`` on a cluster
made by ``stager up --auth``).  ``create`` prints the new token as its last line,
so ``T=$(stager token create --scope read --prefix /datasets/x | tail -1)``
works; the text is shown this once and never stored.  ``--out FILE`` writes it to
a file instead (0600), and only once it is made: a failing ``create`` leaves no
file, prints nothing on stdout and exits non-zero.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import time
from pathlib import Path

from ..auth.keys import write_secret
from ..errors import BadRequest
from ..protocol.authmsg import TokenInfo
from .filecmds import with_client

_TTL = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_ttl(text: str) -> int:
    """``"8h"`` → 28800; plain numbers are seconds."""
    m = _TTL.match(text)
    if not m:
        raise BadRequest(f"not a duration: {text!r} (seconds, or a number with s, m, h, d "
                         "or w)")
    return int(m.group(1)) * _UNITS[m.group(2)]


def _when(t: int | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def token_line(t: TokenInfo, now: float) -> str:
    state = "revoked" if t.revoked is not None else "expired" if t.expires < now else "valid"
    uses = "" if t.uses is None else f"  {t.uses} uses left"
    return (f"{t.id}  {state:<7}  {','.join(t.scopes):<16} {','.join(t.prefixes):<24} "
            f"expires {_when(t.expires)}  {t.name}{uses}")


def write_token_file(path: Path, token: str) -> None:
    """Put ``token`` at ``path``, 0600 from its first byte, replacing what was there in
    one rename (a rotation never leaves an empty or half-written file for a reader)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.new")
    write_secret(tmp, token + "\n")
    try:
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run_create(args: argparse.Namespace) -> int:
    # Nothing reaches stdout (nor --out) unless the token was made: a failure is one
    # line on stderr and a non-zero exit (main), so `… > FILE` or `$(…)` never holds
    # half an answer.
    scopes = sorted(set(args.scope))
    ttl = parse_ttl(args.ttl)
    made = with_client(args, lambda c: c.create_token(scopes, args.prefix or ["/"],
                                                      ttl, args.name, args.uses))
    info = made.info
    summary = (f"token {info.id} ({info.name or 'unnamed'}): {','.join(info.scopes)} on "
               f"{','.join(info.prefixes)}, expires {_when(info.expires)}"
               + ("" if info.uses is None else f", {info.uses} uses"))
    if args.out:
        write_token_file(Path(args.out), made.token)
        print(f"{summary}; written to {args.out}", flush=True)
    else:
        print(f"{summary}\n{made.token}", flush=True)
    return 0


def run_list(args: argparse.Namespace) -> int:
    now = time.time()
    for t in with_client(args, lambda c: c.list_tokens()):
        print(token_line(t, now))
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    info = with_client(args, lambda c: c.revoke_token(args.id))
    print(f"revoked {info.id} ({info.name or 'unnamed'}) at {_when(info.revoked)}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("token", help="bearer tokens: create, list, revoke (admin)")
    tsub = p.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    c = tsub.add_parser("create", help="mint a token; prints it as the last line")
    c.add_argument("--scope", action="append", required=True,
                   choices=("read", "write", "admin", "join", "telemetry", "s3gateway"),
                   help="what it may do (repeat for several)")
    c.add_argument("--prefix", action="append",
                   help="a path it is limited to (repeat for several; default: /)")
    c.add_argument("--ttl", default="24h", help="lifetime: seconds, or 30m, 8h, 7d "
                                                "(default: 24h)")
    c.add_argument("--name", default="", help="a name for the audit log and `token list`")
    c.add_argument("--uses", type=int, metavar="N",
                   help="a join token: register at most N new targets (each storage "
                        "node's first start takes one; later starts use its own credential)")
    c.add_argument("--out", metavar="FILE",
                   help="write the token to FILE (0600, replaced in one rename, only once "
                        "the token is made) instead of printing it")
    c.set_defaults(func=run_create)
    ls = tsub.add_parser("list", help="every token minted: id first, then state, scopes, "
                                      "prefixes, expiry, name")
    ls.set_defaults(func=run_list)
    r = tsub.add_parser("revoke", help="revoke a token at once")
    r.add_argument("id", help="the token's id (from `stager token list`)")
    r.set_defaults(func=run_revoke)
