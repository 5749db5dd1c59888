"""The data server's aiohttp application: thin handlers over DataService."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web

from ..auth import load_public_key
from ..checksum import from_hex, to_hex
from ..config import Config
from ..errors import BadRequest, PayloadTooLarge, RangeNotSatisfiable
from ..protocol import headers as H
from ..protocol.batch import split_chunk_batch
from ..protocol.messages import (
    ChunkBatchStored,
    ChunkDeleted,
    ChunkStored,
    PurgeRequest,
    ReadRequest,
    RemoveResult,
)
from ..protocol.models import parse_chunk_id
from ..protocol.multipart import SealRequest, SealResult
from ..protocol.ranges import content_range, parse_range, unsatisfied_range
from ..web.authmw import GATE, CapabilityGate, quiet_audit, require_files
from ..web.metrics import ServerMetrics
from ..web.middleware import METRICS_KEY, error_response, json_response
from ..web.requests import BodyBuffers, read_body, read_json
from ..web.sendfile import send_region
from ..web.server import add_routes, base_app
from ..web.tlswrite import is_tls, write_body
from . import maintenance
from .service import DataService

SERVICE = web.AppKey("service", DataService)
CONFIG = web.AppKey("config", Config)
BODY_BUFFERS = web.AppKey("body_buffers", BodyBuffers)
BODY_BUFFER_BYTES = 64 << 20    # request bodies kept for reuse, per data server


def make_data_app(config: Config) -> web.Application:
    service = DataService(config)

    async def usage_gauges(metrics: ServerMetrics) -> None:
        usage = await service.usage()
        metrics.gauge("stager_target_capacity_bytes", "bytes this target offers").set(
            usage.capacity)
        metrics.gauge("stager_target_used_bytes", "bytes of chunks stored").set(usage.used)
        metrics.gauge("stager_target_chunks", "chunks stored").set(usage.chunks)

    app = base_app("data", client_max_size=config.max_chunk_size,
                   identity={"id": service.identity.target_id, "node": service.identity.node},
                   refresh_metrics=usage_gauges)
    app[CONFIG] = config
    app[SERVICE] = service
    app[BODY_BUFFERS] = BodyBuffers(BODY_BUFFER_BYTES)
    add_routes(app, "data", HANDLERS)
    maintenance.install(app, service, config)   # chunk listing, scrubber
    if config.auth:     # capabilities; the key from a file, else fetched at registration
        quiet_audit()
        app[GATE] = CapabilityGate(
            load_public_key(Path(config.public_key_file).read_text())
            if config.public_key_file else None, target=service.identity.target_id)
    return app


def _chunk(request: web.Request) -> str:
    chunk = request.match_info["chunk"]
    parse_chunk_id(chunk)
    return chunk


def _svc(request: web.Request) -> DataService:
    return request.app[SERVICE]


def _count(request: web.Request, sent: int = 0, received: int = 0) -> None:
    metrics, service = request.app[METRICS_KEY], _svc(request)
    target = service.identity.target_id
    service.bytes_read += sent
    service.bytes_written += received
    if sent:
        metrics.sent(target, sent)
    if received:
        metrics.received(target, received)


async def put_chunk(request: web.Request) -> web.Response:
    chunk = _chunk(request)
    raw_crc = request.headers.get(H.CRC32C)
    if raw_crc is None:
        raise BadRequest(f"the {H.CRC32C} header is required")
    try:
        crc = from_hex(raw_crc)
    except ValueError:
        raise BadRequest(f"{H.CRC32C} must be 8 hex digits") from None
    limit = request.app[CONFIG].max_chunk_size
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"chunk over the limit of {limit} bytes", limit=limit)
    buffers = request.app[BODY_BUFFERS]
    data = await read_body(request, limit, buffers)
    stored = await _svc(request).put(chunk, data, crc)
    _count(request, received=len(data))
    buffers.give(data)      # only once stored: a failed or cancelled put may still hold it
    # The ack is what the chunk file holds (its trailer, read back), not the request's
    # header: the writer counts this copy only if it matches its own (dataplane/ack.py).
    return json_response(ChunkStored(chunk, stored.data_len, stored.crc).to_json(), status=201)


async def batch_write(request: web.Request) -> web.Response:
    limit = request.app[CONFIG].max_chunk_size
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"chunk batch over the limit of {limit} bytes", limit=limit)
    buffers = request.app[BODY_BUFFERS]
    body = await read_body(request, limit, buffers)
    pieces = split_chunk_batch(body)
    # (each chunk id was checked when parsed: its file id is what precedes the dot)
    require_files(request, "write", (item.chunk.partition(".")[0] for item, _ in pieces))
    stored = await _svc(request).put_many([(item.chunk, data, item.crc)
                                           for item, data in pieces])
    received = sum(len(data) for _, data in pieces)
    buffers.give(body)      # only once stored, as in put_chunk
    _count(request, received=received)
    acks = tuple(ChunkStored(item.chunk, meta.data_len, meta.crc)
                 for (item, _), meta in zip(pieces, stored, strict=True))
    return json_response(ChunkBatchStored(len(pieces), received, acks).to_json(), status=201)


def _chunk_headers(request: web.Request, size: int, crc: int) -> dict[str, str]:
    return {H.CRC32C: to_hex(crc), H.CHUNK_SIZE: str(size), "Accept-Ranges": "bytes",
            H.TARGET: _svc(request).identity.target_id,
            "Content-Type": "application/octet-stream"}


async def get_chunk(request: web.Request) -> web.StreamResponse:
    oc = await _svc(request).open(_chunk(request))
    try:
        size = oc.meta.data_len
        headers = _chunk_headers(request, size, oc.meta.crc)
        try:
            span = parse_range(request.headers.get("Range"), size)
        except RangeNotSatisfiable as exc:
            return error_response(exc, headers={"Content-Range": unsatisfied_range(size)})
        if span is None:
            # The whole chunk: zero-copy; the reader checks the CRC end to end.
            response = web.StreamResponse(status=200, headers=headers)
            response.content_length = size
            await response.prepare(request)
            await send_region(request, response, oc.fd, 0, size)
            await response.write_eof()
            _count(request, sent=size)
            return response
        # A part: verified here, block by block, before it leaves.
        start, stop = span
        data = await asyncio.to_thread(oc.read, start, stop - start)
        headers["Content-Range"] = content_range(start, stop, size)
        _count(request, sent=len(data))
        return web.Response(status=206, body=data, headers=headers)
    finally:
        oc.close()


async def head_chunk(request: web.Request) -> web.Response:
    oc = await _svc(request).open(_chunk(request))
    try:
        # web.Response refuses a content_length assignment; an explicit header is kept.
        headers = _chunk_headers(request, oc.meta.data_len, oc.meta.crc)
        headers["Content-Length"] = str(oc.meta.data_len)
        return web.Response(headers=headers)
    finally:
        oc.close()


async def delete_chunk(request: web.Request) -> web.Response:
    deleted = await _svc(request).delete(_chunk(request))
    return json_response(ChunkDeleted(deleted).to_json())


async def batch_read(request: web.Request) -> web.StreamResponse:
    body = await read_json(request, request.app[CONFIG].max_json_body)
    items = ReadRequest.from_json(body).items
    require_files(request, "read", (i.chunk.partition(".")[0] for i in items))
    batch = await _svc(request).open_batch(list(items))
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream",
                                           H.TARGET: _svc(request).identity.target_id})
    response.content_length = batch.total
    slices = batch.slices()
    tls = is_tls(request)       # over TLS, each slice in views (stager/web/tlswrite.py)
    try:
        # The first slice is read (and verified) before the headers go, so a corrupt
        # chunk there is still a JSON error; a later one can only cut the body short.
        first = await anext(slices, None)
        await response.prepare(request)
        if first is not None:
            await write_body(response, first, tls)
        async for data in slices:
            await write_body(response, data, tls)
    finally:
        await slices.aclose()  # type: ignore[attr-defined]
        batch.close()
    await response.write_eof()
    _count(request, sent=batch.total)
    return response


async def seal_chunks(request: web.Request) -> web.Response:
    """Seal a completed object's chunks here (stager/data/seals.py), or lift the seal."""
    req = SealRequest.from_json(await read_json(request, request.app[CONFIG].max_json_body))
    require_files(request, "cluster", [req.file_id])
    if req.release:
        await _svc(request).unseal([req.file_id])
        return json_response(SealResult(()).to_json())
    differ = await _svc(request).seal(req.file_id, req.count, dict(req.crcs))
    return json_response(SealResult(tuple(differ)).to_json())


async def purge(request: web.Request) -> web.Response:
    req = PurgeRequest.from_json(await read_json(request, request.app[CONFIG].max_json_body))
    require_files(request, "cluster", req.file_ids)
    removed = await _svc(request).purge(list(req.file_ids))
    return json_response(RemoveResult(removed).to_json())


HANDLERS = {
    "put_chunk": put_chunk, "get_chunk": get_chunk, "head_chunk": head_chunk,
    "delete_chunk": delete_chunk, "batch_read": batch_read, "batch_write": batch_write,
    "purge": purge, "seal_chunks": seal_chunks,
    **maintenance.HANDLERS,
}

