"""``stager token create|list|revoke``: bearer tokens, minted by the metadata server.

Every one needs an admin token (``--token-file ROOT/admin.token`` on a cluster
made by ``stager up --auth``).  ``create`` prints the new token as its last line,
so ``T=$(stager token create --scope read --prefix /datasets/x | tail -1)``
works; the text is shown this once and never stored.  ``--out FILE`` writes it to
a file instead (0600), and only once it is made: a failing ``create`` leaves no
file, prints nothing on stdout and exits non-zero.

``create --s3`` mints the token and an S3 key bound to it (stager/meta/s3keys.py):
its last line is ``ACCESS_KEY_ID SECRET_ACCESS_KEY`` (the token's text on the line
before, or in ``--out``), so ``read K S < <(stager token create --s3 … | tail -1)``
works; the key carries the token's scopes, prefixes, expiry and revocation.
``list`` names each token's S3 keys.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BadRequest, NotFound
from ..protocol.authmsg import TokenCreated, TokenInfo
from ..protocol.s3keys import S3KeyCreated, S3KeyInfo
from .filecmds import with_client

if TYPE_CHECKING:   # the client loads when a command talks to a cluster
    from ..client import AsyncClient

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


def token_line(t: TokenInfo, now: float, s3_keys: Sequence[str] = ()) -> str:
    state = "revoked" if t.revoked is not None else "expired" if t.expires < now else "valid"
    uses = "" if t.uses is None else f"  {t.uses} uses left"
    keys = "".join(f"  s3:{k}" for k in s3_keys)
    return (f"{t.id}  {state:<7}  {','.join(t.scopes):<16} {','.join(t.prefixes):<24} "
            f"expires {_when(t.expires)}  {t.name}{uses}{keys}")


def write_token_file(path: Path, token: str) -> None:
    """Put ``token`` at ``path``, 0600 from its first byte, replacing what was there in
    one rename (a rotation never leaves an empty or half-written file for a reader)."""
    from ..auth.keys import write_secret

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
    if args.s3 and args.uses is not None:
        raise BadRequest("--uses limits a join token; an S3 key's token has no uses")
    made: TokenCreated | S3KeyCreated = with_client(
        args, lambda c: c.create_s3_key(scopes, args.prefix or ["/"], ttl, args.name)
        if args.s3 else c.create_token(scopes, args.prefix or ["/"], ttl, args.name,
                                       args.uses))
    info = made.info
    summary = (f"token {info.id} ({info.name or 'unnamed'}): {','.join(info.scopes)} on "
               f"{','.join(info.prefixes)}, expires {_when(info.expires)}"
               + ("" if info.uses is None else f", {info.uses} uses"))
    lines = [summary]
    if args.out:
        write_token_file(Path(args.out), made.token)
        lines[0] += f"; written to {args.out}"
    else:
        lines.append(made.token)
    if isinstance(made, S3KeyCreated):      # the key last: `| tail -1` is the pair
        lines.append(f"{made.access_key} {made.secret_key}")
    print("\n".join(lines), flush=True)
    return 0


def run_list(args: argparse.Namespace) -> int:
    async def both(c: AsyncClient) -> tuple[list[TokenInfo], list[S3KeyInfo]]:
        tokens = await c.list_tokens()
        try:
            return tokens, await c.list_s3_keys()
        except NotFound:            # a metadata server older than S3 keys: none to show
            return tokens, []

    now = time.time()
    tokens, keys = with_client(args, both)
    by_token: dict[str, list[str]] = {}
    for k in keys:
        by_token.setdefault(k.token_id, []).append(k.access_key)
    for t in tokens:
        print(token_line(t, now, by_token.get(t.id, ())))
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
    c.add_argument("--s3", action="store_true",
                   help="also an S3 key bound to the token (its scopes, prefixes, expiry, "
                        "revocation): the last line is ACCESS_KEY_ID SECRET_ACCESS_KEY")
    c.add_argument("--out", metavar="FILE",
                   help="write the token to FILE (0600, replaced in one rename, only once "
                        "the token is made) instead of printing it")
    c.set_defaults(func=run_create)
    ls = tsub.add_parser("list", help="every token minted: id first, then state, scopes, "
                                      "prefixes, expiry, name, its S3 keys")
    ls.set_defaults(func=run_list)
    r = tsub.add_parser("revoke", help="revoke a token at once")
    r.add_argument("id", help="the token's id (from `stager token list`)")
    r.set_defaults(func=run_revoke)
