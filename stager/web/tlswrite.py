"""A large response body written over TLS a view at a time.

asyncio's (and uvloop's) TLS transport encrypts each write whole into its
outgoing memory buffer, then copies that buffer out whole to the socket: a
4 MiB write goes through memory three times, 4 MiB at a time, out of the CPU's
cache.  Handed over :data:`TLS_WRITE` bytes at a time (views of the one buffer,
no copy), the same bytes stay in cache between the encryption and the copies:
a data server's CPU per GB sent over TLS fell from 0.93 s to 0.75
(``python -m bench.profile_tls_send --pieces 4096,4096:256``; docs/tls.md).
Over plain HTTP a body goes whole: the kernel takes it as it is.
"""

from __future__ import annotations

from aiohttp import web

TLS_WRITE = 256 << 10       # bytes handed to a TLS transport per write


def is_tls(request: web.Request) -> bool:
    """Does ``request``'s connection encrypt what is written to it?"""
    transport = request.transport
    return transport is not None and transport.get_extra_info("sslcontext") is not None


async def write_body(response: web.StreamResponse, data: bytes | bytearray | memoryview,
                     tls: bool) -> None:
    """``response.write(data)``, in views of :data:`TLS_WRITE` bytes when ``tls``."""
    if not tls or len(data) <= TLS_WRITE:
        await response.write(data)
        return
    view = memoryview(data)
    for at in range(0, len(view), TLS_WRITE):
        await response.write(view[at:at + TLS_WRITE])
