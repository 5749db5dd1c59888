"""``stager token create|list|revoke``: bearer tokens, minted by the metadata server.

Every one needs an admin token (``--token-file ROOT/admin.token`` on a cluster
made by ``stager up --auth``).  ``create`` prints the new token as its last line,
so ``T=$(stager token create --scope read --prefix /datasets/x | tail -1)``
works; the text is shown this once and never stored.
"""

from __future__ import annotations

import argparse
import re
import time

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
    return (f"{t.id}  {state:<7}  {','.join(t.scopes):<16} {','.join(t.prefixes):<24} "
            f"expires {_when(t.expires)}  {t.name}")


def run_create(args: argparse.Namespace) -> int:
    scopes = sorted(set(args.scope))
    made = with_client(args, lambda c: c.create_token(scopes, args.prefix or ["/"],
                                                      parse_ttl(args.ttl), args.name))
    info = made.info
    print(f"token {info.id} ({info.name or 'unnamed'}): {','.join(info.scopes)} on "
          f"{','.join(info.prefixes)}, expires {_when(info.expires)}")
    print(made.token)
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
                   choices=("read", "write", "admin", "join", "telemetry"),
                   help="what it may do (repeat for several)")
    c.add_argument("--prefix", action="append",
                   help="a path it is limited to (repeat for several; default: /)")
    c.add_argument("--ttl", default="24h", help="lifetime: seconds, or 30m, 8h, 7d "
                                                "(default: 24h)")
    c.add_argument("--name", default="", help="a name for the audit log and `token list`")
    c.set_defaults(func=run_create)
    ls = tsub.add_parser("list", help="every token minted: id first, then state, scopes, "
                                      "prefixes, expiry, name")
    ls.set_defaults(func=run_list)
    r = tsub.add_parser("revoke", help="revoke a token at once")
    r.add_argument("id", help="the token's id (from `stager token list`)")
    r.set_defaults(func=run_revoke)
