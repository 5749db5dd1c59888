"""A data server announces its target to the metadata server and keeps heartbeating."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp

from ..config import Config
from ..errors import TRANSPORT_FAILURES, StagerError, error_from_wire
from ..protocol.messages import Heartbeat
from ..protocol.models import TargetInfo
from ..protocol.routes import route
from .service import DataService

log = logging.getLogger("stager.data")


async def register_and_heartbeat(service: DataService, config: Config, url: str) -> None:
    """Register at ``config.meta_url`` as ``url``, then heartbeat forever.

    A metadata server that is down is retried with backoff; one that forgot the
    target (answers 404 to a heartbeat) gets a fresh registration.
    """
    timeout = aiohttp.ClientTimeout(total=max(config.heartbeat_interval * 2, 5.0))
    ident = service.identity
    async with aiohttp.ClientSession(timeout=timeout) as session:
        registered = False
        delay = 0.1
        while True:
            usage = await service.usage()
            try:
                if not registered:
                    body = TargetInfo(id=ident.target_id, node=ident.node, url=url,
                                      capacity=usage.capacity, used=usage.used,
                                      chunks=usage.chunks).to_json()
                    await _post(session, route("register_target").url(config.meta_url), body)
                    log.info("registered target %s at %s", ident.target_id, config.meta_url)
                    registered = True
                else:
                    status = await _post(
                        session, route("heartbeat").url(config.meta_url,
                                                        target_id=ident.target_id),
                        Heartbeat(usage.capacity, usage.used, usage.chunks).to_json())
                    if status == 404:
                        registered = False
                        continue
                delay = config.heartbeat_interval
            except (*TRANSPORT_FAILURES, StagerError) as exc:
                log.warning("metadata server %s unreachable: %s", config.meta_url, exc)
                delay = min(max(delay * 2, 0.1), config.heartbeat_interval)
            await asyncio.sleep(delay)


async def _post(session: aiohttp.ClientSession, url: str, body: object) -> int:
    async with session.post(url, data=json.dumps(body),
                            headers={"Content-Type": "application/json"}) as resp:
        if resp.status == 404:
            return 404
        if resp.status >= 400:
            raise error_from_wire(resp.status, await resp.read())
        return resp.status
