"""Who may send what: the authorization middleware both servers run.

Every route has an :class:`~stager.protocol.routes.Access` rule in the route
table.  With auth off (no :data:`GATE` on the application) every request is
admitted, as on a loopback development cluster.  With auth on:

- **Metadata server** (:class:`TokenGate`): ``Authorization: Bearer T``;
  a missing, malformed, forged, expired or revoked token is a 401.  The rule's
  scope and what it covers (the whole cluster, the URL's path) are checked here;
  a route whose body names the paths (``on="body"``) checks each in its handler
  with :func:`authorize`, before it acts.  A refusal is a 403.
- **Data server** (:class:`CapabilityGate`): ``X-Stager-Capability``, one or
  more capabilities separated by spaces, verified with the metadata server's
  public key alone and remembered per text.  An item ``ref1.<id>`` stands for a
  text this server verified and still holds (:mod:`stager.auth.refs`); any other
  is a 401 with reason ``unknown_reference``, and the client sends the text.  The
  URL's chunk is checked here; a batch's chunks in the handler with
  :func:`require_files`.

The metadata server writes an audit line (logger ``stager.audit``) for every
request that is not a GET or HEAD (but heartbeats, loader telemetry and
capability requests: :data:`CHATTER`), and for every refusal: token id and
name, operation, paths, status.  A data server writes one for every refusal and every
maintenance request (purge, delete, scrub); a line per chunk written would drown
the log, and the metadata server already logged the create it belongs to.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..auth import Capability, CapabilityCache, Token
from ..auth.policy import (
    CAP_GRANTS,
    SERVER_SCOPES,
    acts_for,
    allows,
    capability_allows,
    granted,
    is_server_credential,
    require,
    visible,
)
from ..errors import Forbidden, StagerError, Unauthenticated, Unavailable
from ..protocol import headers as H
from ..protocol.models import parse_chunk_id
from ..protocol.paths import normalize
from ..protocol.routes import Route, route

audit = logging.getLogger("stager.audit")
# POSTs and PUTs that change nothing a user owns, sent every few seconds by machines:
# audited only when refused.
CHATTER = frozenset({"heartbeat", "heartbeats", "report_rank", "report_ranks",
                     "capabilities"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_CAPABILITIES = 4096         # per request: a batch of many small files carries many
# ... all in one header: a file capability's text is at most 276 characters, and a space
# (stager.web.server makes the servers' header field limit this long); a batch
# capability's (up to 256 files) is about 7.6 KB, and a client sends at most 256 Ki
# characters of them (stager.client.capabilities.MAX_HEADER).
CAPABILITY_HEADER_BYTES = MAX_CAPABILITIES * 280
VERIFY_ON_LOOP = 32            # new capabilities verified on the loop; more go to a thread
TOKEN = web.RequestKey("token", Token)              # the verified bearer token
CAPS = web.RequestKey("caps", list[Capability])     # the verified capabilities
CHECKED = web.RequestKey("checked", list[str])      # paths authorized, for the audit line
HERE = web.RequestKey("here", str)                  # a data server's own target id


class Gate(Protocol):
    role: str

    async def admit(self, request: web.Request, rule: Route) -> None:
        """Raise :class:`Unauthenticated` or :class:`Forbidden`, or admit ``request``."""
        ...


GATE = web.AppKey("gate", Gate)


class TokenGate:
    """The metadata server's gate: bearer tokens, checked by ``authenticate``."""

    role = "meta"

    def __init__(self, authenticate: Callable[[str], Token]) -> None:
        self.authenticate = authenticate

    async def admit(self, request: web.Request, rule: Route) -> None:
        access = rule.access
        assert access is not None
        if access.scope == "public":
            return
        header = request.headers.get(H.AUTHORIZATION, "")
        scheme, _, text = header.partition(" ")
        if not header:
            raise Unauthenticated("this cluster needs a token: Authorization: Bearer TOKEN "
                                  "(STAGER_TOKEN, STAGER_TOKEN_FILE or --token-file)",
                                  reason="missing")
        if scheme.lower() != "bearer" or not text.strip():
            raise Unauthenticated("the Authorization header is not 'Bearer TOKEN'",
                                  reason="malformed")
        token = self.authenticate(text.strip())
        request[TOKEN] = token
        if is_server_credential(token) and access.scope not in granted(token) | {"server"}:
            # before anything of the request is parsed: a stolen storage node's
            # credential learns nothing from a route that is not its job
            raise Forbidden(f"token {token.name!r} is a server's credential (a data "
                            "server's or an S3 gateway's): it does its one job, nothing "
                            "else", token=token.id)
        if access.scope == "any":
            return
        if access.scope == "server":
            if not granted(token) & SERVER_SCOPES:
                raise Forbidden(f"token {token.name!r} lacks the 'join' scope",
                                token=token.id, scope="join")
            return
        if access.on == "cluster":
            require(token, access.scope, None)
        elif access.on == "path":
            authorize(request, access.scope, request.match_info["path"])
        elif access.on == "visible":
            path = normalize(request.match_info["path"])
            if not (allows(token, access.scope, path) or visible(token, path)):
                require(token, access.scope, path)          # raises, naming what is missing
            _checked(request).append(path)
        elif access.scope not in granted(token):            # "body", "none": scope only
            raise Forbidden(f"token {token.name!r} lacks the {access.scope!r} scope",
                            token=token.id, scope=access.scope)


class CapabilityGate:
    """A data server's gate: capabilities, verified with the metadata server's public
    key (set once it is known: until then every guarded request is a 503).  ``target``
    is this server's target id: the metadata server's capabilities name the one
    target they are for, and are refused anywhere else."""

    role = "data"

    def __init__(self, public: Ed25519PublicKey | None = None, *, target: str) -> None:
        self.target = target
        self.cache: CapabilityCache | None = None
        if public is not None:
            self.trust(public)

    def trust(self, public: Ed25519PublicKey) -> None:
        self.cache = CapabilityCache(public)

    async def admit(self, request: web.Request, rule: Route) -> None:
        access = rule.access
        assert access is not None
        if access.scope == "public":
            return
        if self.cache is None:
            raise Unavailable("this data server does not have the metadata server's "
                              "public key yet")
        texts = request.headers.get(H.CAPABILITY, "").split()
        if not texts:
            raise Unauthenticated(f"a data server needs a capability ({H.CAPABILITY}); "
                                  "the metadata server hands them out with layouts",
                                  reason="missing")
        if len(texts) > MAX_CAPABILITIES:
            raise Unauthenticated(f"more than {MAX_CAPABILITIES} capabilities in one request",
                                  reason="malformed")
        now = time.time()
        cache = self.cache
        if len(texts) > VERIFY_ON_LOOP \
                and sum(not cache.known(t) for t in texts) > VERIFY_ON_LOOP:
            # ~0.13 ms each: thousands of new ones (a first batch over many small files,
            # or a flood of forged ones) would hold every other request up.
            caps = await asyncio.to_thread(lambda: [cache.item(t, now) for t in texts])
        else:
            caps = [cache.item(t, now) for t in texts]
        request[CAPS] = caps
        request[HERE] = self.target
        if access.on == "cluster":
            _require_caps(caps, None, "cluster", self.target)
        elif access.on == "chunk":
            _require_caps(caps, parse_chunk_id(request.match_info["chunk"])[0], access.scope,
                          self.target)
        elif not any(access.scope in CAP_GRANTS[c.op]
                     and (c.target is None or c.target == self.target) for c in caps):
            # "body": the handler checks each file the body names; the scope here, so
            # that a batch naming no file is no way around it (a read capability once
            # had an empty chunk batch written, 201).
            raise Forbidden(f"no capability in this request allows {access.scope}",
                            op=access.scope)


def quiet_audit() -> None:
    """Audit lines are logged at INFO whatever the server's log level (``--log-level``
    WARNING would drop them); a level set on ``stager.audit`` itself is kept."""
    if audit.level == logging.NOTSET:
        audit.setLevel(logging.INFO)


def authorize(request: web.Request, scope: str, path: str | None) -> None:
    """For a handler: the request's token must grant ``scope`` on ``path`` (normalized
    here; ``None``: the whole cluster).  Nothing to check with auth off."""
    token: Token | None = request.get(TOKEN)
    if token is None:
        return
    where = None if path is None else normalize(path)
    require(token, scope, where)
    _checked(request).append(where or "/")


def speak_for(request: web.Request, target_id: str) -> None:
    """For a handler of a data server's report: only the target's own credential (or
    an admin token) speaks for ``target_id``.  Nothing to check with auth off."""
    token: Token | None = request.get(TOKEN)
    if token is not None and not acts_for(token, target_id):
        raise Forbidden(f"token {token.name!r} does not speak for target {target_id}",
                        token=token.id, target=target_id)


def token_of(request: web.Request) -> Token | None:
    """The verified token of ``request``; ``None`` with auth off (or a public route)."""
    return request.get(TOKEN)


def require_files(request: web.Request, op: str, file_ids: Iterable[str]) -> None:
    """For a data server's batch handler: the request's capabilities must allow ``op``
    on every one of ``file_ids``.  Nothing to check with auth off."""
    caps: list[Capability] | None = request.get(CAPS)
    if caps is None:
        return
    # The files the request's own file capabilities grant, taken out of the files
    # wanted one capability at a time, each a loop in C over the smaller of what is
    # still wanted and what it grants (a Python test per file cost a batch read of
    # small files ~0.5 us a file; a request of thousands of capabilities stays linear
    # in them).  What no file capability grants is checked against them all (a
    # server capability, or the refusal) as before.
    missing = set(file_ids)
    for c in caps:
        if not missing:
            break
        if c.target is not None or op not in CAP_GRANTS[c.op]:
            continue
        if not c.files:
            missing.discard(c.file_id)
        elif len(missing) <= len(c.files):
            missing = missing - c.files         # looks each file still wanted up
        else:
            missing.difference_update(c.files)  # takes each file granted out
    if missing:
        here = request.get(HERE)
        for file_id in missing:
            _require_caps(caps, file_id, op, here)


def _require_caps(caps: list[Capability], file_id: str | None, op: str,
                  here: str | None) -> None:
    if any(capability_allows(c, file_id, op, here) for c in caps):
        return
    what = "maintenance" if file_id is None else f"{op} of file {file_id}"
    raise Forbidden(f"no capability in this request allows {what}", file=file_id, op=op)


def _checked(request: web.Request) -> list[str]:
    checked = request.get(CHECKED)
    if checked is None:
        checked = request[CHECKED] = []
    return checked


def _rule(request: web.Request) -> Route | None:
    name = request.match_info.route.name
    try:
        return route(name) if name else None
    except KeyError:
        return None


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    gate = request.app.get(GATE)
    if gate is None or (rule := _rule(request)) is None:    # auth off: no rule looked up
        return await handler(request)
    status = 500
    try:
        await gate.admit(request, rule)
        response = await handler(request)
        status = response.status
        return response
    except StagerError as exc:
        status = exc.status
        raise
    finally:
        _audit(request, gate, rule, status)


def _audit(request: web.Request, gate: Gate, rule: Route, status: int) -> None:
    refused = status in (401, 403)
    if gate.role == "meta":
        if not refused and (request.method in ("GET", "HEAD") or rule.op in CHATTER):
            return
        token: Token | None = request.get(TOKEN)
        who = f"token={token.id} name={token.name!r}" if token else "token=-"
    else:
        assert rule.access is not None
        if not refused and rule.access.scope != "cluster":
            return
        caps: list[Capability] = request.get(CAPS) or []
        who = "holder=" + (",".join(sorted({c.holder for c in caps})) or "-")
    paths = request.get(CHECKED) or [request.match_info.get("path")
                                     or request.match_info.get("chunk") or "-"]
    audit.info("%s op=%s path=%s status=%d", who, rule.op,
               ",".join(_one_line(str(p)) for p in paths), status)


def _one_line(text: str) -> str:
    """``text`` with its control characters escaped: a request names what it likes
    (a chunk id is any URL segment, ``%0A`` included), and one audit line must stay one
    line, not forge a second."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
