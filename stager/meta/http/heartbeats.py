"""The batched heartbeat route: one request for every target of a data server process.

See :mod:`stager.protocol.heartbeats` for why and for the wire shape.  Every item is
proven (:func:`~stager.meta.targetauth.prove`) before any is taken: a credential that is
another target's refuses the whole batch (403: the sender speaks for a target it does
not hold); a refused credential (revoked, expired: 401) or a target this server does not
know (404: the sender registers it again) fails its own item, and the others go ahead.
The per-target route (``heartbeat`` in :mod:`.app`) stays for data servers older than this one.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from ...errors import BadRequest, PayloadTooLarge, StagerError, Unauthenticated
from ...protocol.batch import parse_items, results_json
from ...protocol.heartbeats import BeatItem, decode_batch
from ...web.authmw import token_of
from ...web.middleware import json_response
from ...web.requests import PARSE_AWAY, parse_json, read_body
from .. import targetauth, targetstats
from .authapp import auth_of


async def heartbeats(request: web.Request) -> web.Response:
    service = request.app[targetstats.BEATEN]
    limit = service.config.max_json_body
    raw = bytes(await read_body(request, limit))
    if len(raw) > limit:            # a chunked body has no length to refuse up front
        raise PayloadTooLarge(f"JSON body over {limit} bytes", limit=limit)
    items = decode_batch(raw) if len(raw) <= PARSE_AWAY else None
    if items is None:       # not plainly valid, or large: the reference parser decides
        body = await asyncio.to_thread(parse_json, raw) if len(raw) > PARSE_AWAY \
            else parse_json(raw or b"{}")
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        items = parse_items(body, BeatItem.from_json, key=lambda i: i.target_id)
    auth, bearer = auth_of(request), token_of(request)
    # Every item proven before any is taken: a credential that is not its target's
    # (Forbidden) refuses the whole batch; one refused outright (revoked, expired: the
    # target joins again) fails its own item.
    results: list[StagerError | None] = []
    for item in items:
        try:
            targetauth.prove(auth, bearer, item.target_id, item.credential)
            results.append(None)
        except Unauthenticated as exc:
            results.append(exc)
    # the beats proven, taken together: on a shared store one write for all of them
    proven = [i for i, r in enumerate(results) if r is None]
    taken = await service.heartbeats([
        (items[i].target_id, items[i].beat.capacity, items[i].beat.used, items[i].beat.chunks)
        for i in proven])
    for index, outcome in zip(proven, taken, strict=True):
        if isinstance(outcome, StagerError):
            results[index] = outcome
        else:
            targetstats.observe(request, items[index].target_id, items[index].beat)
    # null for a beat taken: the sender needs no more, and the target's record
    # (dataclasses.asdict) was two fifths of the handler's time
    return json_response(results_json(results, lambda r: None))


HANDLERS = {"heartbeats": heartbeats}
