"""Send a region of an open file as the body of a prepared response.

On the standard asyncio loop this is the kernel's ``sendfile`` (zero copy);
where the loop has no native sendfile (uvloop), or the connection is TLS
(the bytes must be encrypted on their way out), it falls back to reads in a
worker thread and ordinary writes.
"""

from __future__ import annotations

import asyncio
import os

from aiohttp import web

from .tlswrite import write_body

# Where sendfile cannot serve (TLS): a whole default chunk per read, not 1 MiB: the
# server's CPU per GB over TLS 0.93 s against 1.18 (bench.profile_tls_send).
FALLBACK_PIECE = 4 << 20


async def send_region(request: web.Request, response: web.StreamResponse, fd: int,
                      offset: int, count: int) -> None:
    """``count`` bytes of ``fd`` from ``offset``; ``response`` must be prepared."""
    transport = request.transport
    if transport is None:
        raise ConnectionResetError("connection lost")
    loop = asyncio.get_running_loop()
    tls = transport.get_extra_info("sslcontext") is not None
    if not tls:
        with open(fd, "rb", buffering=0, closefd=False) as fileobj:
            try:
                await loop.sendfile(transport, fileobj, offset, count, fallback=False)
                return
            except (NotImplementedError, asyncio.SendfileNotAvailableError):
                pass
    end = offset + count
    while offset < end:
        data = await asyncio.to_thread(os.pread, fd, min(FALLBACK_PIECE, end - offset), offset)
        if not data:
            raise ConnectionResetError("file shrank while sending")
        await write_body(response, data, tls)
        offset += len(data)
