"""Chunk requests to data servers: the one place chunk bytes cross the wire.

Both the client library and the metadata server's whole-file gateway use this
module, so there is one read path and one write path.  Every request to a data
server goes through :meth:`DataPlane.request` (or its raw twins: reads, and a small
chunk's PUT in :mod:`.rawput`), which counts it per target and maps its failures
through :mod:`stager.errors`.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import payload
from aiohttp.abc import AbstractStreamWriter

from ..auth.refs import UNKNOWN
from ..auth.tls import client_ssl
from ..checksum import to_hex
from ..config import Config
from ..errors import (
    TRANSPORT_FAILURES,
    CorruptChunk,
    InternalError,
    StagerError,
    TargetUnavailable,
    Unauthenticated,
    error_from_wire,
    unreachable,
)
from ..protocol import headers
from ..protocol.batch import ChunkItem, chunk_batch_head
from ..protocol.cache import Filled, FillItem
from ..protocol.messages import ChunkStored, PurgeRequest, ReadRequest, RemoveResult
from ..protocol.models import ReadItem, parse_chunk_id
from ..protocol.routes import Route, route
from . import ack, rawhttp
from .credentials import Credentials
from .learnt import CrcMemory
from .tails import Tails

READ_BUFSIZE = 1 << 20
Filler = Callable[[Sequence[FillItem]], Awaitable[list[Filled | StagerError]]]
WRITE_FLOOR_RATE = 8 << 20     # bytes/s below which a chunk write counts as hung
QUICK_FAILURE = 1.0            # seconds: a write failing faster is retried (a stale
                               # keep-alive connection, a refused connect), a slower one not
_PUT_CHUNK, _GET_CHUNK = route("put_chunk"), route("get_chunk")
_BATCH_WRITE, _BATCH_READ, _PURGE = route("batch_write"), route("batch_read"), route("purge")


class ChunkBody(payload.BytesPayload):
    """A chunk as a request body, sent without copying it.

    Handed to aiohttp whole, a body is copied twice on its way out: joined to
    the request head (aiohttp does so on Python before 3.12.9, where
    ``writelines`` would copy anyway), and whatever the socket does not take at
    once is copied into the transport's buffer, which for a 4 MiB chunk is most
    of it.  Written in slices instead, with a drain between them, each slice
    goes straight to the socket; only what the kernel does not accept at once
    is copied.  (aiohttp's warning about large raw-bytes bodies is about
    compressing them on the loop; chunk bodies are never compressed.)
    """

    FIRST = 16 * 1024       # joined to the request head, so keep it small
    SLICE = 256 * 1024

    def __init__(self, value: bytes | bytearray | memoryview) -> None:
        payload.Payload.__init__(self, value, content_type="application/octet-stream")
        self._size = memoryview(value).nbytes

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: AbstractStreamWriter,
                                content_length: int | None) -> None:
        view = memoryview(self._value).cast("B")
        if content_length is not None:
            view = view[:content_length]
        pos = min(self.FIRST, len(view))
        await writer.write(view[:pos])
        while pos < len(view):
            await writer.write(view[pos:pos + self.SLICE])     # drains when needed
            pos += self.SLICE


@dataclass
class TargetCounters:
    """What one client saw of one target: for telemetry and for failover."""

    requests: int = 0
    errors: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    seconds: float = 0.0
    failed_at: float = 0.0           # monotonic time of the last connection failure

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "errors": self.errors,
                "bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
                "seconds": round(self.seconds, 6)}


@dataclass
class PlaneOptions:
    connect_timeout: float = 5.0
    request_timeout: float = 60.0
    connections_per_target: int = 8
    retries: int = 3
    avoid_failed_for: float = 5.0    # seconds a failed target is tried last
    raw_reads: bool = True           # reads land in their buffers by recv_into (rawhttp)
    failover_timeout: float | None = None  # silence after which a read gives a replica up
    write_timeout: float = 10.0      # a chunk write not answered in this time (plus its
                                     # bytes at WRITE_FLOOR_RATE) fails: routed around
    ca_file: str = ""                # CA bundle https:// servers are checked against
                                     # ("": the system's store)

    @classmethod
    def of(cls, config: Config) -> PlaneOptions:
        """The options ``config`` sets (the client's and the metadata server's planes)."""
        return cls(connect_timeout=config.connect_timeout,
                   request_timeout=config.request_timeout,
                   connections_per_target=config.connections_per_target,
                   retries=config.retries, failover_timeout=config.failover_timeout,
                   write_timeout=config.write_timeout, ca_file=config.ca_file)


class _PlaneConnector(aiohttp.TCPConnector):
    """aiohttp's connector, carrying the raw read connections, which close with it."""

    def __init__(self, raw: rawhttp.RawPool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.raw = raw

    def close(self, *, abort_ssl: bool = False) -> Any:
        self.raw.close()
        return super().close(abort_ssl=abort_ssl)


def make_session(options: PlaneOptions, *, limit: int = 0) -> aiohttp.ClientSession:
    """The one session a client (or the metadata server) talks to servers over;
    ``https://`` servers are verified against ``options.ca_file``."""
    tls = client_ssl(options.ca_file)
    raw = rawhttp.RawPool(limit=options.connections_per_target,
                          connect_timeout=options.connect_timeout,
                          read_timeout=options.request_timeout,
                          ssl_context=tls if isinstance(tls, ssl.SSLContext) else None)
    connector = _PlaneConnector(raw, limit=limit, ssl=tls,
                                limit_per_host=options.connections_per_target,
                                ttl_dns_cache=300, enable_cleanup_closed=False)
    timeout = aiohttp.ClientTimeout(total=None, connect=options.connect_timeout,
                                    sock_read=options.request_timeout)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                 read_bufsize=READ_BUFSIZE, raise_for_status=False)


def unknown_target(target: str) -> TargetUnavailable:
    """The error for a target a layout names but the caller has no address for
    (the read engine, the striped writer, the batched writer)."""
    return TargetUnavailable(f"target {target} is unknown", target=target)


@dataclass
class DataPlane:
    """Chunk operations against data servers over one shared HTTP session."""

    session: aiohttp.ClientSession
    options: PlaneOptions = field(default_factory=PlaneOptions)
    counters: dict[str, TargetCounters] = field(default_factory=dict)
    credentials: Credentials | None = None   # capabilities shown to data servers (auth on)
    # Asks the metadata server to fill chunks of cached files (route ``fill``): the
    # client's metadata connection, or the metadata server's own service.
    filler: Filler | None = None
    # The CRC32Cs of cached chunks learnt from fills, and the reads of them to report
    # (:mod:`.learnt`): a client's reads of filled chunks skip the fill round trip.
    learnt: CrcMemory | None = None
    # Read-ahead past ranged reads' ends, parked for the range that follows (:mod:`.tails`)
    tails: Tails = field(default_factory=Tails)

    def counter(self, target: str) -> TargetCounters:
        c = self.counters.get(target)
        if c is None:
            c = self.counters[target] = TargetCounters()
        return c

    def order_replicas(self, targets: Sequence[str]) -> list[str]:
        """Replicas in layout order, but recently failed targets last."""
        now = time.monotonic()
        avoid = self.options.avoid_failed_for

        def recently_failed(t: str) -> bool:
            c = self.counters.get(t)
            return c is not None and now - c.failed_at < avoid

        return sorted(targets, key=recently_failed)

    @asynccontextmanager
    async def request(self, target: str, url: str, op: Route, *, json_body: Any = None,
                      **kwargs: Any) -> AsyncIterator[aiohttp.ClientResponse]:
        """One request ``op`` to ``target`` at ``url``: counted in the target's
        counters, an error answer raised as its stager error, a transport failure
        as :class:`TargetUnavailable` (and the target tried last for a while).
        ``kwargs``: the route's path parameters, ``query``, ``files`` (the file ids a
        batch touches, for its capabilities), and aiohttp's request options
        (``data``, ``headers``, ``timeout``); ``json_body`` is sent as JSON."""
        params = {k: kwargs.pop(k) for k in op.path_params}
        where = op.url(url, query=kwargs.pop("query", None), **params)
        files = kwargs.pop("files", ())
        credential = await self.credential(op, params.get("chunk"), files, target)
        if credential:
            kwargs["headers"] = {**kwargs.get("headers", {}), **credential}
        if json_body is not None:
            kwargs["data"] = json.dumps(json_body).encode()
            kwargs["headers"] = {"Content-Type": "application/json", **kwargs.get("headers", {})}
        counter = self.counter(target)
        counter.requests += 1
        start = time.perf_counter()
        try:
            for attempt in (0, 1):
                async with self.session.request(op.method, where, **kwargs) as resp:
                    if resp.status >= 400:
                        error = error_from_wire(resp.status, await resp.read())
                        if attempt == 0 and self.stale_reference(target, error):
                            # refused before the body was used: again, with the texts
                            credential = await self.credential(op, params.get("chunk"),
                                                               files, target)
                            kwargs["headers"] = {**kwargs["headers"], **credential}
                            continue
                        raise error
                    self.accepted_by(target, credential)
                    yield resp
                    return
        except StagerError:
            counter.errors += 1
            raise
        except TRANSPORT_FAILURES as exc:
            raise self._unreachable(target, url, exc) from exc
        finally:
            counter.seconds += time.perf_counter() - start

    async def credential(self, op: Route, chunk: str | None = None,
                         files: Collection[str] = (), target: str | None = None
                         ) -> dict[str, str]:
        """The capability header ``op`` needs (on ``chunk``, or on the chunks of
        ``files``, on ``target``); empty with auth off."""
        access = op.access
        if self.credentials is None or access is None or access.scope == "public":
            return {}
        if chunk is not None:
            files = (parse_chunk_id(chunk)[0],)
        text = await self.credentials.header(access.scope, files, target)
        return {headers.CAPABILITY: text} if text else {}

    def accepted_by(self, target: str, hdrs: dict[str, str]) -> None:
        """``target`` answered a request sent with ``hdrs``: it holds the capability
        texts they carried, and is shown their references next time
        (:meth:`stager.client.capabilities.CapabilityBook.accepted`)."""
        value = hdrs.get(headers.CAPABILITY)
        if value:
            accepted = getattr(self.credentials, "accepted", None)
            if accepted is not None:
                accepted(target, value)

    def stale_reference(self, target: str, error: StagerError) -> bool:
        """Whether ``error`` is ``target`` not holding a capability a reference named
        (it restarted, or evicted it): then its references are forgotten, and the
        request may go again with the texts (once: it then shows no reference)."""
        if not isinstance(error, Unauthenticated) or error.details.get("reason") != UNKNOWN:
            return False
        forget = getattr(self.credentials, "forget_references", None)
        if forget is None:
            return False
        forget(target)
        return True

    async def fill(self, items: Sequence[FillItem]) -> list[Filled | StagerError]:
        """Each item's chunks filled (see :mod:`stager.protocol.cache`), or its error."""
        if self.filler is None:
            raise InternalError("this data plane cannot read cached files: it has no filler")
        return await self.filler(items)

    async def warm(self, op: str, file_ids: Collection[str]) -> None:
        """Have the capabilities for ``op`` on ``file_ids`` at hand before the requests
        that need them (one fetch for a whole read plan, not one per target; pass each
        target's files together, so that its requests carry few batch capabilities)."""
        if self.credentials is not None and file_ids:
            await self.credentials.plan(op, list(file_ids))

    def _unreachable(self, target: str, url: str, exc: BaseException) -> StagerError:
        """Count a connection failure (so failover tries the target last) and name it."""
        counter = self.counter(target)
        counter.errors += 1
        counter.failed_at = time.monotonic()
        return unreachable(exc, f"target {target} at {url} unreachable", target=target, url=url)

    async def put_chunk(self, target: str, url: str, chunk: str, data: bytes | memoryview,
                        crc: int) -> None:
        """Store one chunk on one target (see :meth:`_write`); returns once its
        answer proves it stored (:func:`.ack.prove_put`)."""
        answer = await self._write(target, url, _PUT_CHUNK, data,
                                   {headers.CRC32C: to_hex(crc)}, len(data), chunk=chunk)
        ack.prove_put(target, answer, ChunkStored(chunk, memoryview(data).nbytes, crc))

    async def put_chunks(self, target: str, url: str,
                         items: Sequence[tuple[str, bytes | memoryview, int]]) -> None:
        """Store many ``(chunk, data, crc)`` on one target in one request
        (a chunk batch, see :mod:`stager.protocol.batch`; see :meth:`_write`);
        returns once its answer proves every one stored (:func:`.ack.prove_batch`)."""
        sent = [ChunkStored(c, memoryview(d).nbytes, crc) for c, d, crc in items]
        head = chunk_batch_head([ChunkItem(s.chunk, s.size, s.crc) for s in sent])
        body = b"".join([head, *(d for _, d, _ in items)])
        answer = await self._write(target, url, _BATCH_WRITE, body,
                                   {"Content-Type": "application/octet-stream"},
                                   len(body) - len(head),
                                   files={parse_chunk_id(c)[0] for c, _, _ in items})
        ack.prove_batch(target, answer, sent)

    async def _write(self, target: str, url: str, op: Route, body: bytes | memoryview,
                     hdrs: dict[str, str], payload_bytes: int, **params: Any) -> bytes:
        """One chunk write, its answer's body returned: given up after ``write_timeout``
        (plus the time its bytes take at :data:`WRITE_FLOOR_RATE`), so a hung target
        fails it instead of stalling it; a quick transport failure is retried (PUT is
        idempotent), a slow one is not: the writer routes around the target instead."""
        limit = self.options.write_timeout + len(body) / WRITE_FLOOR_RATE
        timeout = aiohttp.ClientTimeout(total=limit, sock_connect=min(
            self.options.connect_timeout, self.options.write_timeout))
        for attempt in range(self.options.retries + 1):
            start = time.monotonic()
            try:
                async with self.request(target, url, op, data=ChunkBody(body), headers=hdrs,
                                        timeout=timeout, **params) as resp:
                    answer = await resp.read()
                    self.counter(target).bytes_written += payload_bytes
                    return answer
            except TargetUnavailable:
                if attempt == self.options.retries or time.monotonic() - start > QUICK_FAILURE:
                    raise
                await asyncio.sleep(0.05 * 2 ** attempt)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def read_timeout(self, patient: bool) -> float:
        """Silence (connect included) after which a read is given up: short when
        another replica can be tried (``failover_timeout``), else ``request_timeout``."""
        fast = self.options.failover_timeout
        if patient or not fast:
            return self.options.request_timeout
        return min(fast, self.options.request_timeout)

    async def read_chunk_into(self, target: str, url: str, chunk: str, offset: int,
                              out: memoryview, *, whole: bool = False,
                              patient: bool = False) -> int | None:
        """Read ``len(out)`` bytes of ``chunk`` at ``offset`` into ``out``.

        Returns the chunk's CRC32C from the server when ``whole`` (the caller
        checks it against the committed checksum), else ``None``; ranged reads
        are verified block by block on the server.  ``patient``: no replica is
        left to try, so wait ``request_timeout`` (see :meth:`read_timeout`).
        """
        hdrs = {} if whole else {"Range": f"bytes={offset}-{offset + len(out) - 1}"}
        hdrs.update(await self.credential(_GET_CHUNK, chunk, target=target))
        timeout = self.read_timeout(patient)
        pool = self._raw_pool()
        if pool is not None:
            try:
                got = await self._read_raw(pool, target, url, _GET_CHUNK.target(chunk=chunk),
                                           _GET_CHUNK, hdrs, None, out, chunk, timeout,
                                           chunk=chunk)
            except rawhttp.Unsupported:
                pass    # a response the raw client does not frame: aiohttp reads it below
            else:
                crc = got.get(headers.CRC32C.lower())
                return int(crc, 16) if whole and crc else None
        async with self.request(target, url, _GET_CHUNK, chunk=chunk, headers=hdrs,
                                timeout=_client_timeout(timeout)) as resp:
            await _read_exactly(resp, out, target, chunk)
            self.counter(target).bytes_read += len(out)
            crc = resp.headers.get(headers.CRC32C)
            return int(crc, 16) if whole and crc else None

    async def batch_read_into(self, target: str, url: str, items: Sequence[ReadItem],
                              out: memoryview, *, patient: bool = False) -> None:
        """Many pieces from one target in one request, concatenated into ``out``."""
        body = json.dumps(ReadRequest(tuple(items)).to_json()).encode()
        timeout = self.read_timeout(patient)
        files = _files_of(items)
        hdrs = {"Content-Type": "application/json",
                **await self.credential(_BATCH_READ, None, files, target)}
        pool = self._raw_pool()
        if pool is not None:
            try:
                await self._read_raw(pool, target, url, _BATCH_READ.target(),
                                     _BATCH_READ, hdrs, body, out, "batch", timeout,
                                     files=files)
                return
            except rawhttp.Unsupported:
                pass    # a response the raw client does not frame: aiohttp reads it below
        async with self.request(target, url, _BATCH_READ, data=body, headers=hdrs,
                                files=files, timeout=_client_timeout(timeout)) as resp:
            await _read_exactly(resp, out, target, "batch")
            self.counter(target).bytes_read += len(out)

    def _raw_pool(self) -> rawhttp.RawPool | None:
        pool = getattr(self.session.connector, "raw", None)
        return pool if self.options.raw_reads and not self.session.closed else None

    async def _read_raw(self, pool: rawhttp.RawPool, target: str, url: str, path: str,
                        op: Route, hdrs: dict[str, str], body: bytes | None, out: memoryview,
                        what: str, timeout: float | None = None, *, chunk: str | None = None,
                        files: Collection[str] = ()) -> dict[str, str]:
        """One read through :mod:`rawhttp` into ``out``, counted and mapped as
        :meth:`request` does (sent again with the capability texts, as there, when a
        reference was stale: ``chunk``/``files`` say which); returns the response
        headers (lower-case names)."""
        counter = self.counter(target)
        counter.requests += 1
        start = time.perf_counter()
        try:
            resp = await pool.request(url, op.method, path, hdrs, body, out, timeout=timeout)
            if resp.status >= 400:
                error = error_from_wire(resp.status, resp.body)
                if not self.stale_reference(target, error):
                    raise error
                # an error's body never goes to ``out``: nothing of it was used
                hdrs = {**hdrs, **await self.credential(op, chunk, files, target)}
                resp = await pool.request(url, op.method, path, hdrs, body, out,
                                          timeout=timeout)
                if resp.status >= 400:
                    raise error_from_wire(resp.status, resp.body)
        except rawhttp.Unsupported:
            counter.requests -= 1   # the caller sends it again through aiohttp
            raise
        except rawhttp.LengthMismatch as exc:
            counter.errors += 1
            if exc.length > exc.want:
                raise CorruptChunk(f"target {target} sent more bytes than asked for {what}",
                                   target=target) from None
            raise TargetUnavailable(f"target {target} sent {exc.length} of {exc.want} bytes "
                                    f"of {what}", target=target) from None
        except StagerError:
            counter.errors += 1
            raise
        except TRANSPORT_FAILURES as exc:
            raise self._unreachable(target, url, exc) from exc
        finally:
            counter.seconds += time.perf_counter() - start
        counter.bytes_read += len(out)
        self.accepted_by(target, hdrs)
        return resp.headers

    async def purge(self, target: str, url: str, file_ids: Sequence[str]) -> int:
        async with self.request(target, url, _PURGE,
                                json_body=PurgeRequest(tuple(file_ids)).to_json()) as resp:
            return RemoveResult.from_json(await resp.json()).removed


def _files_of(items: Sequence[ReadItem]) -> set[str]:
    # The ids are ours (made by chunk_id), and the data server checks them anyway.
    return {i.chunk.partition(".")[0] for i in items}


def _client_timeout(seconds: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=None, sock_connect=seconds, sock_read=seconds)


async def _read_exactly(resp: aiohttp.ClientResponse, out: memoryview, target: str,
                        what: str) -> None:
    pos = 0
    want = len(out)
    async for data in resp.content.iter_any():
        end = pos + len(data)
        if end > want:
            raise CorruptChunk(f"target {target} sent more bytes than asked for {what}",
                               target=target)
        out[pos:end] = data
        pos = end
    if pos != want:
        raise TargetUnavailable(f"target {target} sent {pos} of {want} bytes of {what}",
                                target=target)
