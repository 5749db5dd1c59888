"""Large bodies over TLS go out a view at a time (stager/web/tlswrite.py), whole."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from stager.auth.tls import client_context, ensure_cluster_tls, server_context
from stager.web.tlswrite import TLS_WRITE, is_tls, write_body

BODY = os.urandom(4 * TLS_WRITE + 12345)      # several views and a short last one


@pytest.mark.parametrize("tls", [True, False])
async def test_a_body_written_in_views_arrives_whole(tmp_path: Path, tls: bool) -> None:
    seen: list[bool] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(is_tls(request))
        response = web.StreamResponse()
        response.content_length = len(BODY)
        await response.prepare(request)
        await write_body(response, bytearray(BODY), is_tls(request))
        await response.write_eof()
        return response

    files = ensure_cluster_tls(tmp_path)
    app = web.Application()
    app.router.add_get("/body", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0,
                       ssl_context=server_context(files.cert, files.key) if tls else None)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session, session.get(
                f"{'https' if tls else 'http'}://127.0.0.1:{port}/body",
                ssl=client_context(files.ca_cert) if tls else False) as resp:
            assert await resp.read() == BODY
        assert seen == [tls]
    finally:
        await runner.cleanup()
