"""Small chunk PUTs through the raw HTTP/1.1 client (:mod:`.rawhttp`), not aiohttp.

A small file's gateway PUT sends its one chunk to a data server while its client
waits; aiohttp's client (a request object, a writer task, a response object and
its stream per request) was 40-50% of the metadata server's handler time for a
1 KiB file (py-spy, ``python -m bench.profile_small_put``).  A chunk of at most
``limit`` bytes goes instead as one ``write`` of head and body on a kept-alive
:class:`~.rawhttp.RawPool` connection (the data plane's, so TLS targets use its
``ssl`` context), its small JSON ack read back into a scratch buffer.  Larger
chunks stay on aiohttp, whose :class:`~.transport.ChunkBody` sends them in slices
without copying them.

Resending is safe: a chunk PUT names (file id, chunk index), a file id is never
reused for other bytes (a new version is a new id), and the data server writes the
chunk to a temporary file, fsyncs it and renames it over its name (or renames
first under a new name and fsyncs file and directory before the 201:
:mod:`stager.storage.chunkstore`), so a second PUT of the same chunk stores the
same bytes under the same name, and its ack proves them.  The pool resends once,
on a fresh connection, when a kept-alive one is reset before a byte of the answer
came (the server closed it while idle).  Any other quick failure of the raw
request falls back to aiohttp's path (:meth:`DataPlane.put_chunk`, which retries
quick failures as it always did); a slow one (a hung target) is the target's
failure at once, so that the writer routes around it no later than before.
"""

from __future__ import annotations

import time

from ..checksum import to_hex
from ..errors import TRANSPORT_FAILURES, StagerError, error_from_wire, unreachable
from ..protocol import headers
from ..protocol.messages import ChunkStored
from ..protocol.routes import route
from . import ack, rawhttp
from .transport import QUICK_FAILURE, WRITE_FLOOR_RATE, DataPlane

RAW_PUT_MAX = 256 << 10     # bytes: a chunk this small goes through the raw client
ACK_MAX = 4096              # bytes: a chunk PUT's ack (about 150) fits
_PUT_CHUNK = route("put_chunk")


def raw_pool(plane: DataPlane) -> rawhttp.RawPool | None:
    """The plane's raw connections (carried by its session's connector), while open."""
    pool = getattr(plane.session.connector, "raw", None)
    return pool if isinstance(pool, rawhttp.RawPool) and not plane.session.closed else None


async def put_chunk(plane: DataPlane, target: str, url: str, chunk: str,
                    data: bytes | memoryview, crc: int, *, limit: int = RAW_PUT_MAX) -> None:
    """:meth:`DataPlane.put_chunk`: one chunk stored on one target, proved by its
    answer; through the raw client when it is at most ``limit`` bytes."""
    size = memoryview(data).nbytes
    pool = raw_pool(plane)
    if pool is None or size > limit or not url.startswith(("http://", "https://")):
        await plane.put_chunk(target, url, chunk, data, crc)
        return
    sent = ChunkStored(chunk, size, crc)
    hdrs = {"Content-Type": "application/octet-stream", headers.CRC32C: to_hex(crc),
            **await plane.credential(_PUT_CHUNK, chunk, target=target)}
    counter = plane.counter(target)
    counter.requests += 1
    start = time.perf_counter()
    answer = memoryview(bytearray(ACK_MAX))
    try:
        for attempt in (0, 1):
            resp = await pool.request(url, _PUT_CHUNK.method, _PUT_CHUNK.target(chunk=chunk),
                                      hdrs, memoryview(data).cast("B"), answer, exact=False,
                                      timeout=plane.options.write_timeout
                                      + size / WRITE_FLOOR_RATE)
            if resp.status < 400:
                break
            error = error_from_wire(resp.status, resp.body)
            if attempt or not plane.stale_reference(target, error):
                raise error
            # a reference the target no longer holds: refused before the body was
            # stored, so it goes again with the capability's text
            hdrs.update(await plane.credential(_PUT_CHUNK, chunk, target=target))
    except (rawhttp.Unsupported, rawhttp.LengthMismatch):
        # an answer this client does not frame, or an ack past ACK_MAX: aiohttp's path
        # sends it again and reads whatever comes back
        counter.requests -= 1
        await plane.put_chunk(target, url, chunk, data, crc)
        return
    except StagerError:
        counter.errors += 1
        raise
    except TRANSPORT_FAILURES as exc:
        if time.perf_counter() - start <= QUICK_FAILURE:
            counter.requests -= 1       # counted again by the path that retries it
            await plane.put_chunk(target, url, chunk, data, crc)
            return
        counter.errors += 1
        counter.failed_at = time.monotonic()        # tried last for a while, as a read's
        raise unreachable(exc, f"target {target} at {url} unreachable", target=target,
                          url=url) from exc
    finally:
        counter.seconds += time.perf_counter() - start
    counter.bytes_written += size
    plane.accepted_by(target, hdrs)
    ack.prove_put(target, bytes(answer[:resp.length]), sent)
