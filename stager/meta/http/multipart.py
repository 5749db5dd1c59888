"""The multipart routes: thin handlers over :class:`~stager.meta.multipart.MultipartService`.

Every route but the listing names an upload; its handler checks the token against
the upload's path (write; read for its parts).  A listing shows the uploads under
paths the token may read.  Slots carry a capability for their file id when auth is on
(write where a part goes, read where a completion's parts are composed from).  The
idle-upload collection runs on the duty holder, beside garbage collection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from aiohttp import web

from ...auth.policy import allows
from ...errors import Unavailable
from ...protocol.models import MAX_LIST_LIMIT, TargetInfo
from ...protocol.multipart import (
    CompleteRequest,
    MultipartCreate,
    MultipartList,
    MultipartUpload,
    Part,
    PartBegin,
    PartDone,
    PartList,
    PartSlot,
    SealRequest,
    SealResult,
)
from ...protocol.routes import route
from ...web.authmw import authorize, token_of
from ...web.middleware import json_response
from ...web.requests import query_int, read_json
from ..multipart import MultipartService, Sealer
from ..store.multipart import MultipartRecord
from .authapp import auth_of

log = logging.getLogger("stager.meta")
MULTIPART = web.AppKey("multipart", MultipartService)
MAX_BODY = 4 << 20              # a completion of 10000 parts, or a part's checksums


def install(app: web.Application, service: MultipartService) -> None:
    app[MULTIPART] = service


def background(interval: Callable[[], float]
               ) -> Callable[[web.Application], AsyncIterator[None]]:
    """The cleanup context that aborts idle uploads, every ``interval()`` seconds, on
    the server that holds the duties."""
    async def run(app: web.Application) -> AsyncIterator[None]:
        async def loop() -> None:
            multipart = app[MULTIPART]
            while True:
                await asyncio.sleep(interval())
                if not multipart.service.duties_held:
                    continue
                try:
                    await multipart.collect_idle()
                except Unavailable as exc:
                    log.warning("multipart collection: %s; will retry", exc)
                except Exception:
                    log.exception("multipart collection failed; will retry")

        task = asyncio.create_task(loop())
        yield
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    return run


def upload_json(record: MultipartRecord) -> dict[str, Any]:
    return MultipartUpload(record.upload_id, record.path, record.file_id, record.layout,
                           record.part_size, record.created, record.touched,
                           record.extra).to_json()


def _capable(request: web.Request, slot: PartSlot, op: str) -> PartSlot:
    auth, token = auth_of(request), token_of(request)
    if auth is None or token is None:
        return slot
    return replace(slot, capability=auth.capability(slot.file_id, op, token.id))


async def _record(request: web.Request, scope: str = "write") -> MultipartRecord:
    record = await request.app[MULTIPART].get(request.match_info["upload_id"])
    authorize(request, scope, record.path)
    return record


def _number(request: web.Request) -> str:
    return request.match_info["number"]


async def multipart_create(request: web.Request) -> web.Response:
    req = MultipartCreate.from_json(await read_json(request, MAX_BODY))
    authorize(request, "write", req.path)
    return json_response(upload_json(await request.app[MULTIPART].create(
        req.path, req.layout, req.extra)))


async def multipart_list(request: web.Request) -> web.Response:
    token = token_of(request)
    prefix = request.query.get("prefix", "/")
    after = (request.query.get("after_path", ""), request.query.get("after_id", ""))
    limit = query_int(request, "limit", MAX_LIST_LIMIT) or MAX_LIST_LIMIT
    records = await request.app[MULTIPART].uploads(prefix, after, min(limit, MAX_LIST_LIMIT))
    shown = [r for r in records if token is None or allows(token, "read", r.path)]
    return json_response(MultipartList(tuple(MultipartUpload.from_json(upload_json(r))
                                             for r in shown), len(records) == limit).to_json())


async def multipart_parts(request: web.Request) -> web.Response:
    record = await _record(request, "read")
    parts = await request.app[MULTIPART].store.list_parts(record.upload_id)
    body = PartList(MultipartUpload.from_json(upload_json(record)),
                    tuple(Part(p.number, p.size, p.md5, p.written) for p in parts))
    return json_response(body.to_json())


async def multipart_part_begin(request: web.Request) -> web.Response:
    record = await _record(request)
    req = PartBegin.from_json(await read_json(request, MAX_BODY))
    slot = await request.app[MULTIPART].begin_part(record, _number(request),
                                                   req.size)
    return json_response(_capable(request, slot, "write").to_json())


async def multipart_part_done(request: web.Request) -> web.Response:
    # the record as settled: its path (the scope checked) and its slots do not change
    record = await request.app[MULTIPART].settled(request.match_info["upload_id"])
    authorize(request, "write", record.path)
    done = PartDone.from_json(await read_json(request, MAX_BODY))
    part = await request.app[MULTIPART].record_part(record, _number(request), done)
    return json_response(part.to_json())


async def multipart_complete(request: web.Request) -> web.Response:
    record = await _record(request)
    req = CompleteRequest.from_json(await read_json(request, MAX_BODY))
    result = await request.app[MULTIPART].complete(record.upload_id, req.parts, req.attrs,
                                                   _sealer(request))
    result = replace(result, compose=tuple(
        replace(p, slot=_capable(request, p.slot, "read")) if p.slot is not None else p
        for p in result.compose))
    return json_response(result.to_json())


def _sealer(request: web.Request) -> Sealer:
    """Seal requests to the data servers, over the metadata server's data plane."""
    from .app import GATEWAY  # (app.py imports this module)
    plane = request.app[GATEWAY].plane

    async def seal(target: TargetInfo, req: SealRequest) -> SealResult:
        async with plane.request(target.id, target.url, route("seal_chunks"),
                                 json_body=req.to_json()) as resp:
            return SealResult.from_json(await resp.json())

    return seal


async def multipart_abort(request: web.Request) -> web.Response:
    record = await _record(request)
    return json_response(upload_json(await request.app[MULTIPART].abort(record.upload_id)))


HANDLERS = {"multipart_create": multipart_create, "multipart_list": multipart_list,
            "multipart_parts": multipart_parts, "multipart_part_begin": multipart_part_begin,
            "multipart_part_done": multipart_part_done,
            "multipart_complete": multipart_complete, "multipart_abort": multipart_abort}
