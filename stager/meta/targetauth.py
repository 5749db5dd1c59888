"""Who may register a storage target, and at what address: server identity.

Every storage node holds a join token, so a join token alone proves only that its
holder may add a target, never that it *is* a given one.  With auth on:

- **A new target id** registers with a join token (one of its uses, when it was
  minted with ``--uses N``) or an admin token.  The metadata server then mints the
  target its own **credential** (a token of the ``target`` scope naming that one
  target), pins the credential's id to the target in the store, and answers it once;
  the data server keeps it 0600 under its root (``ROOT/target.credential``) and
  presents it for everything it says from then on (heartbeats, leaving, scrub
  reports, registering again).
- **A registered target** registers again with its pinned credential, at any URL.
  A join token cannot move it, nor take it over while a credential is pinned to it;
  it may re-register it only at the URL it has and only when no live credential is
  pinned (a target registered before credentials existed adopts one this way, and
  so does one whose credential an operator revoked to rotate it).  An admin token
  may do anything, and pins a fresh credential (the old one stops working).
- **In a TLS cluster** (this server serves HTTPS) a target registers an ``https://``
  URL, and before a new URL is taken the metadata server asks it ``GET /v1/health``
  trusting only the cluster's CA (``ca_file``): the certificate must verify and the
  answer must name the target.

With auth off there are no credentials: anyone who reaches the port may do anything.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import aiohttp

from ..auth import Token
from ..auth.policy import acts_for, allows
from ..auth.tls import client_ssl
from ..config import Config
from ..errors import TRANSPORT_FAILURES, AlreadyExists, BadRequest, Forbidden
from ..protocol.models import TargetInfo
from ..protocol.routes import route
from .auth import MetaAuth
from .service import MetaService

log = logging.getLogger("stager.meta")
PROBE_TIMEOUT = 5.0         # seconds for a new target URL to answer its health probe


@dataclass(frozen=True)
class Registration:
    """What a registration may do: take the target's record, and whether to mint it a
    fresh credential (pinned in place of ``replaces``)."""

    mint: bool
    replaces: str | None = None
    spends: str | None = None       # the join token whose use this takes


async def register(auth: MetaAuth | None, service: MetaService, config: Config,
                   token: Token | None, target: TargetInfo) -> tuple[TargetInfo, str | None]:
    """Register ``target`` for ``token``'s holder: the stored record, and the new
    credential to hand back (``None``: keep the one presented, or auth is off)."""
    if config.tls_cert and not target.url.startswith("https://"):
        raise BadRequest(f"this cluster serves TLS: target {target.id} must register an "
                         f"https:// URL, not {target.url}", target=target.id)
    if auth is None or token is None:
        return await service.register_target(target), None
    decision = await _decide(auth, service, token, target)
    known = service.targets.get(target.id)
    if config.tls_cert and (known is None or known.url != target.url):
        await probe(target, config)
    if decision.spends is not None and not await service.store.take_token_use(decision.spends):
        raise Forbidden(f"token {token.name!r} has no registrations left (--uses)",
                        token=token.id)
    stored = await service.register_target(target)
    if not decision.mint:
        return stored, None
    text, info = await auth.mint_target_credential(target.id)
    if not await service.store.pin_target_credential(target.id, info.id,
                                                     replaces=decision.replaces):
        await auth.revoke(info.id)
        raise AlreadyExists(f"target {target.id} was given a credential by another registration "
                       "just now", target=target.id)
    if decision.replaces is not None:
        await auth.revoke(decision.replaces)
    log.info("target %s: credential %s pinned (%s)", target.id, info.id, token.name)
    return stored, text


async def _decide(auth: MetaAuth, service: MetaService, token: Token,
                  target: TargetInfo) -> Registration:
    pinned = await service.store.target_credential(target.id)
    live = pinned if pinned is not None and not auth.is_revoked(pinned) else None
    if token.target is not None:                        # a target credential
        if token.target != target.id or (live is not None and live != token.id):
            raise Forbidden(f"this credential is not target {target.id}'s", target=target.id)
        if live is None:                                # the pin was lost (a migration)
            if not await service.store.pin_target_credential(target.id, token.id,
                                                             replaces=pinned):
                raise AlreadyExists(f"target {target.id}'s credential changed just now",
                               target=target.id)
        return Registration(mint=False)
    if allows(token, "admin", None):
        return Registration(mint=True, replaces=pinned)
    if not allows(token, "join", None):         # a join token on a prefix: covers no "/"
        raise Forbidden(f"token {token.name!r} may not register targets (it needs the "
                        "join scope on /)", token=token.id, scope="join")
    if live is not None:
        raise Forbidden(f"target {target.id} is registered and holds its own credential: "
                        "it registers with that (ROOT/target.credential), or an admin "
                        "re-registers it", target=target.id)
    known = service.targets.get(target.id)
    if known is not None and known.url != target.url:
        raise Forbidden(f"target {target.id} is registered at {known.url}: moving it needs "
                        "its credential or an admin token", target=target.id)
    return Registration(mint=True, replaces=pinned,
                        spends=token.id if known is None and pinned is None else None)


async def probe(target: TargetInfo, config: Config) -> None:
    """Ask ``target``'s URL who it is, trusting only the cluster's CA."""
    url = route("health").url(target.url)
    connector = aiohttp.TCPConnector(ssl=client_ssl(config.ca_file))
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT)
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session, \
                session.get(url) as resp:
            answer = json.loads(await resp.read()) if resp.status == 200 else None
    except (*TRANSPORT_FAILURES, ValueError) as exc:
        raise BadRequest(f"target {target.id} at {target.url} did not answer as a server "
                         f"whose certificate the cluster's CA signed: {exc}",
                         target=target.id) from None
    if not isinstance(answer, dict) or answer.get("id") != target.id:
        raise BadRequest(f"{target.url} does not answer as target {target.id}",
                         target=target.id)


async def forget(auth: MetaAuth | None, service: MetaService, target_id: str) -> TargetInfo:
    """``stager target forget``: see :meth:`MetaService.forget_target`; its credential
    is revoked too, so the server it belonged to can never speak for it again."""
    pinned = await service.store.target_credential(target_id)
    info = await service.forget_target(target_id)
    if auth is not None and pinned is not None:
        await auth.revoke(pinned)
    return info


def prove(auth: MetaAuth | None, bearer: Token | None, target_id: str,
          credential: str | None) -> None:
    """One item of a batched heartbeat speaks for ``target_id`` only when proven: by its
    own ``credential`` (that target's, verified and not revoked), or, with none, by the
    request's ``bearer`` (the sender's own target's credential, or an admin token).  A
    data server process thus speaks for exactly the targets whose credentials it holds.
    Raises :class:`Unauthenticated` (a credential refused: the target joins again) or
    :class:`Forbidden`; nothing to prove with auth off."""
    if auth is None or bearer is None:
        return
    token = bearer if credential is None else auth.authenticate(credential)
    if credential is not None and token.target is None:
        raise Forbidden(f"the credential of item {target_id} is not a target's",
                        target=target_id)
    if not acts_for(token, target_id):
        raise Forbidden(f"token {token.name!r} does not speak for target {target_id}",
                        token=token.id, target=target_id)
