"""The cache routes: thin handlers over :class:`~stager.meta.cache.service.CacheService`.

Attaching and detaching take an admin token on the directory (the metadata server
reads the source with the options given, on the cluster's behalf); a refresh, a
write token on it; a fill, a read token on every file it names; a listing and
``stager status`` show a token the attachments on paths it may read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from ...auth.policy import allows
from ...errors import StagerError
from ...protocol.batch import parse_items, results_json
from ...protocol.cache import (
    AttachmentList,
    AttachRequest,
    Detached,
    FillItem,
    PlanPosition,
    PlanRequest,
    ReadsCounted,
    check_plan_id,
)
from ...protocol.models import field_of
from ...web.authmw import token_of
from ...web.middleware import json_response
from ...web.requests import path_arg, read_json
from ..cache.service import CacheService

CACHE = web.AppKey("cache", CacheService)
MAX_BODY = 64 << 10             # an attach request: a URL, globs, storage options
log = logging.getLogger(__name__)


def install(app: web.Application, cache: CacheService) -> None:
    app[CACHE] = cache
    cache.service.status_sources.append(cache.status_sections)


def background(interval: float) -> Any:
    """A cleanup context: the duty holder's cache upkeep every ``interval`` seconds."""
    async def run(app: web.Application) -> AsyncIterator[None]:
        cache = app[CACHE]

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval)
                if not cache.service.duties_held:
                    continue
                try:
                    await cache.upkeep()
                except StagerError as exc:
                    log.warning("cache upkeep: %s; will retry", exc)
                except Exception:
                    log.exception("cache upkeep failed; will retry")

        task = asyncio.create_task(loop())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await cache.close()
    return run


def _readable(request: web.Request, path: str) -> bool:
    token = token_of(request)
    return token is None or allows(token, "read", path)


async def list_attachments(request: web.Request) -> web.Response:
    shown = [a for a in await request.app[CACHE].attachments.list()
             if _readable(request, a.path)]
    return json_response(AttachmentList(tuple(shown)).to_json())


async def attach(request: web.Request) -> web.Response:
    req = AttachRequest.from_json(await read_json(request, MAX_BODY))
    return json_response((await request.app[CACHE].attachments.attach(
        path_arg(request), req)).to_json())


async def refresh_attachment(request: web.Request) -> web.Response:
    return json_response((await request.app[CACHE].attachments.refresh(
        path_arg(request))).to_json())


async def detach(request: web.Request) -> web.Response:
    path = path_arg(request)
    files, chunks = await request.app[CACHE].attachments.detach(path)
    return json_response(Detached(path, files, chunks).to_json())


async def fill(request: web.Request) -> web.Response:
    cache = request.app[CACHE]
    body = await read_json(request, cache.service.config.max_json_body)
    items = parse_items(body, FillItem.from_json)
    warm = field_of(body, "warm", bool, False)      # stager warm: no hits or misses
    results = await cache.filler.fill(items, lambda p: _readable(request, p), count=not warm)
    return json_response(results_json(results, lambda r: r.to_json()))


async def cache_reads(request: web.Request) -> web.Response:
    cache = request.app[CACHE]
    body = await read_json(request, cache.service.config.max_json_body)
    items = parse_items(body, FillItem.from_json)
    counted = await cache.filler.count_reads(items, lambda p: _readable(request, p))
    return json_response(ReadsCounted(counted).to_json())


def _owner(request: web.Request) -> str | None:
    token = token_of(request)
    return None if token is None else token.id


async def register_plan(request: web.Request) -> web.Response:
    cache = request.app[CACHE]
    req = PlanRequest.from_json(await read_json(request, cache.service.config.max_json_body))
    done = await cache.plans.register(check_plan_id(request.match_info["plan_id"]), req,
                                      owner=_owner(request),
                                      may_read=lambda p: _readable(request, p))
    return json_response(done.to_json())


async def plan_position(request: web.Request) -> web.Response:
    at = PlanPosition.from_json(await read_json(request, MAX_BODY))
    answer = await request.app[CACHE].plans.position(
        check_plan_id(request.match_info["plan_id"]), at, owner=_owner(request), rank=at.rank)
    return json_response(answer.to_json())


HANDLERS = {"list_attachments": list_attachments, "attach": attach,
            "refresh_attachment": refresh_attachment, "detach": detach, "fill": fill,
            "cache_reads": cache_reads, "register_plan": register_plan,
            "plan_position": plan_position}
