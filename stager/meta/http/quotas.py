"""The quota and pin routes: thin handlers over :class:`~stager.meta.quotas.QuotaService`.

Setting a quota takes an admin token on the directory; pinning, a write token on
the path; a listing, and ``stager status``, show a token the quotas and pins on
paths it may read.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ...auth.policy import allows
from ...protocol.quotas import PinList, PinRequest, QuotaList, QuotaRequest, Unpinned
from ...web.authmw import token_of
from ...web.middleware import json_response
from ...web.requests import path_arg, read_json
from ..quotas import QuotaService

QUOTAS = web.AppKey("quotas", QuotaService)
MAX_BODY = 4096                 # {"bytes": N, "files": N} or {"ttl": S}


def install(app: web.Application, service: QuotaService) -> None:
    app[QUOTAS] = service


def _readable(request: web.Request, path: str) -> bool:
    token = token_of(request)
    return token is None or allows(token, "read", path)


def readable_sections(request: web.Request, sections: dict[str, Any]) -> dict[str, Any]:
    """The ``quotas`` and ``pins`` sections of ``stager status``, of the paths the
    request's token may read (as the listings show them)."""
    return {name: [entry for entry in sections.get(name, ())
                   if _readable(request, entry["path"])] for name in ("quotas", "pins")}


async def list_quotas(request: web.Request) -> web.Response:
    quotas = [q for q in await request.app[QUOTAS].list() if _readable(request, q.path)]
    return json_response(QuotaList(tuple(quotas)).to_json())


async def set_quota(request: web.Request) -> web.Response:
    req = QuotaRequest.from_json(await read_json(request, MAX_BODY))
    quota = await request.app[QUOTAS].set(path_arg(request), max_bytes=req.bytes,
                                          max_files=req.files)
    return json_response(quota.to_json())


async def list_pins(request: web.Request) -> web.Response:
    pins = [p for p in await request.app[QUOTAS].pins() if _readable(request, p.path)]
    return json_response(PinList(tuple(pins)).to_json())


async def pin(request: web.Request) -> web.Response:
    req = PinRequest.from_json(await read_json(request, MAX_BODY))
    return json_response((await request.app[QUOTAS].pin(path_arg(request),
                                                        ttl=req.ttl)).to_json())


async def unpin(request: web.Request) -> web.Response:
    path = path_arg(request)
    await request.app[QUOTAS].unpin(path)
    return json_response(Unpinned(path).to_json())


HANDLERS = {"list_quotas": list_quotas, "set_quota": set_quota, "list_pins": list_pins,
            "pin": pin, "unpin": unpin}
