"""A data server announces its target to the metadata server and keeps heartbeating
(with the other targets of its process, in one request: stager/data/beats.py)."""

from __future__ import annotations

import asyncio
import logging
import secrets

import aiohttp
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..auth import load_public_key
from ..auth.tls import client_ssl
from ..config import Config
from ..errors import TRANSPORT_FAILURES, StagerError, Unauthenticated, error_from_wire
from ..protocol.authmsg import PublicKey, TargetRegistered
from ..protocol.heartbeats import BeatItem
from ..protocol.messages import Heartbeat
from ..protocol.metaurls import meta_urls
from ..protocol.models import TargetInfo
from ..protocol.routes import route
from ..storage import Usage
from ..web.authmw import CapabilityGate
from .beats import Beats, joined, post_json
from .credential import TargetCredential
from .service import DataService

log = logging.getLogger("stager.data")


async def register_and_heartbeat(service: DataService, config: Config, url: str,
                                 gate: CapabilityGate | None = None) -> None:
    """Register at ``config.meta_url`` as ``url``, then heartbeat forever.

    With several metadata servers (``http://a:7070,http://b:7070``, on one store),
    everything goes to the first that answers; a failure moves to the next.  A
    metadata server that is down is retried with backoff; one that does not know
    the target (answers 404 to a heartbeat) gets a fresh registration.  With auth on
    (``gate``), the metadata server's public key comes first, unless the gate was
    given it (``public_key_file``); the first registration shows the join token and
    keeps the target credential it is answered (stager/data/credential.py), which
    every later request shows instead.  Each call is one incarnation of the server: it
    registers with a boot id of its own, so a suspicion of the last one's target is
    dropped at once (stager/meta/suspicion.py).
    """
    boot = secrets.token_hex(8)
    timeout = aiohttp.ClientTimeout(total=max(config.heartbeat_interval * 2, 5.0))
    ident, credential = service.identity, service.credential
    urls, current = meta_urls(config.meta_url), 0
    connector = aiohttp.TCPConnector(ssl=client_ssl(config.ca_file))
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session, \
            joined(config) as hub:      # the other targets of this process beat with it
        registered = False
        delay = 0.1
        while True:
            usage = await service.usage()
            meta = urls[current]
            try:
                if gate is not None and gate.cache is None:
                    gate.trust(await _public_key(session, meta))
                    log.info("trusting the metadata server's public key")
                if not registered:
                    body = TargetInfo(id=ident.target_id, node=ident.node, url=url,
                                      capacity=usage.capacity, used=usage.used,
                                      chunks=usage.chunks, boot=boot).to_json()
                    _, answer = await post_json(session, route("register_target").url(meta), body,
                                            credential.headers())
                    minted = TargetRegistered.from_json(answer).credential
                    if minted is not None:
                        credential.keep(minted)
                    log.info("registered target %s at %s", ident.target_id, meta)
                    registered = True
                else:
                    status = await _beat(hub.to(meta), BeatItem(
                        ident.target_id, _heartbeat(service, usage)), credential, config)
                    if status == 404:
                        registered = False
                        continue
                delay = config.heartbeat_interval
            except Unauthenticated as exc:
                # The credential kept was revoked (rotation) or forged: drop it and join
                # again; a join token refused is the operator's to fix, said each round.
                log.warning("metadata server %s refused this target: %s", meta, exc)
                registered = False
                if credential.held:
                    credential.drop()
                    delay = 0.0
                else:
                    delay = config.heartbeat_interval
            except (*TRANSPORT_FAILURES, StagerError) as exc:
                log.warning("metadata server %s unreachable: %s", meta, exc)
                current = (current + 1) % len(urls)
                if current == 0:            # every one failed: back off
                    delay = min(max(delay * 2, 0.1), config.heartbeat_interval)
                else:
                    delay = 0.0
            await asyncio.sleep(delay)


async def leave(service: DataService, config: Config, *, within: float = 2.0) -> bool:
    """Tell the metadata server that this server's target is leaving (it is
    stopping), so that it is marked down now rather than after missed heartbeats.
    Best effort, within ``within`` seconds: whether a metadata server took it."""
    target_id = service.identity.target_id
    connector = aiohttp.TCPConnector(ssl=client_ssl(config.ca_file))
    async with aiohttp.ClientSession(connector=connector) as session:
        for meta in meta_urls(config.meta_url):
            try:
                async with asyncio.timeout(within):
                    status, _ = await post_json(session, route("leave_target").url(
                        meta, target_id=target_id), {}, service.credential.headers())
            except (*TRANSPORT_FAILURES, StagerError, TimeoutError) as exc:
                log.warning("could not tell %s that target %s is leaving: %s",
                            meta, target_id, exc)
                continue
            if status != 404:
                log.info("told %s that target %s is leaving", meta, target_id)
                return True
    return False


async def _beat(beats: Beats, item: BeatItem, credential: TargetCredential,
                config: Config) -> int:
    """Send ``item``: in this process's next batch, unless auth is on and the target
    holds no credential of its own yet (a batch item is proven by one); its status."""
    if config.auth and not credential.held:
        status, _ = await post_json(beats.session, route("heartbeat").url(
            beats.meta, target_id=item.target_id), item.beat.to_json(), credential.headers())
        return status
    status, _ = await beats.send(item, credential.headers())
    return status


def _heartbeat(service: DataService, usage: Usage) -> Heartbeat:
    scrub = service.scrubber.progress if service.scrubber is not None else None
    return Heartbeat(usage.capacity, usage.used, usage.chunks, service.bytes_read,
                     service.bytes_written, scrub)


async def _public_key(session: aiohttp.ClientSession, meta: str) -> Ed25519PublicKey:
    async with session.get(route("auth_key").url(meta)) as resp:
        if resp.status >= 400:
            raise error_from_wire(resp.status, await resp.read())
        return load_public_key(PublicKey.from_json(await resp.json()).public_key)
