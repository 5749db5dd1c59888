"""A data server's maintenance routes: chunk listing (for fsck) and scrubbing.

:func:`install` adds the scrubber to a data application: its background task,
and a middleware that hands every chunk a read found corrupt to the scrubber.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from aiohttp import web

from ..aio import cancel_and_wait
from ..config import Config
from ..errors import CorruptChunk
from ..protocol.messages import ScrubRequest
from ..web.middleware import Handler
from ..web.requests import read_json
from .scrub import Scrubber
from .service import DataService

SCRUBBER = web.AppKey("scrubber", Scrubber)
NDJSON = "application/x-ndjson"


def install(app: web.Application, service: DataService, config: Config) -> Scrubber:
    """Give ``app`` a scrubber (background passes when ``scrub_interval`` > 0)."""
    scrubber = Scrubber(service.store, service.identity.target_id, config,
                        service.credential.headers)
    app[SCRUBBER] = scrubber
    service.scrubber = scrubber     # its progress rides on the heartbeats
    app.middlewares.append(suspect_middleware)

    async def background(app: web.Application) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(scrubber.run())] if config.scrub_interval > 0 else []
        yield
        await cancel_and_wait(tasks)

    app.cleanup_ctx.append(background)
    return scrubber


@web.middleware
async def suspect_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Reads that hit a corrupt chunk tell the scrubber, which has it repaired."""
    try:
        return await handler(request)
    except CorruptChunk as exc:
        chunk = exc.details.get("chunk")
        if isinstance(chunk, str):
            request.app[SCRUBBER].suspect(chunk)
        raise


async def list_chunks(request: web.Request) -> web.StreamResponse:
    """Every chunk as one JSON array per line, then ``{"done": true, "count": N}``."""
    store = request.app[SCRUBBER].store
    response = web.StreamResponse(headers={"Content-Type": NDJSON})
    await response.prepare(request)
    count = 0
    for top in await asyncio.to_thread(store.top_dirs):
        rows = await asyncio.to_thread(store.scan, top)
        if rows:
            await response.write("".join(json.dumps([r.name, r.size, r.mtime]) + "\n"
                                         for r in rows).encode())
            count += len(rows)
    await response.write(json.dumps({"done": True, "count": count}).encode() + b"\n")
    await response.write_eof()
    return response


async def scrub_chunks(request: web.Request) -> web.StreamResponse:
    """Verify every chunk now: progress lines, then ``{"done": true, corrupt: [...]}``.

    ``rate`` (bytes/s, default 0 = no limit).  Corrupt chunks are listed, not
    reported: the caller (the metadata server's ``stager scrub``) repairs them.
    """
    rate = ScrubRequest.from_json(await read_json(request, 1 << 16)).rate or 0
    response = web.StreamResponse(headers={"Content-Type": NDJSON})
    await response.prepare(request)

    async def progress(checked: int, nbytes: int) -> None:
        await response.write(json.dumps({"checked": checked, "bytes": nbytes}).encode()
                             + b"\n")

    result = await request.app[SCRUBBER].full_pass(rate=rate, progress=progress)
    await response.write(json.dumps({"done": True, **result.to_json()}).encode() + b"\n")
    await response.write_eof()
    return response


HANDLERS = {"list_chunks": list_chunks, "scrub_chunks": scrub_chunks}
