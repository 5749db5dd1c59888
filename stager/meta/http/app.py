"""The metadata server's aiohttp application: thin handlers over MetaService."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from email.utils import formatdate

import msgspec
from aiohttp import web

from ...auth.policy import visible
from ...config import Config
from ...dataplane import DataPlane, PlaneOptions, make_session
from ...dataplane.credentials import ServerCredential
from ...errors import PayloadTooLarge, RangeNotSatisfiable, StagerError, Unavailable
from ...protocol import messages as m
from ...protocol.authmsg import TargetRegistered
from ...protocol.batch import CommitItem, CreateItem, parse_items, results_json
from ...protocol.cache import Filled, FillItem
from ...protocol.headers import accepts_gzip, etag_matches
from ...protocol.listing import listing_body, wants_shared
from ...protocol.models import FileInfo, LayoutSpec, TargetInfo, check_file_id
from ...protocol.ranges import content_range, parse_range, unsatisfied_range
from ...web import idempotency
from ...web.authmw import authorize, speak_for, token_of
from ...web.metrics import ServerMetrics
from ...web.middleware import METRICS_KEY, encode_json, error_response, json_response
from ...web.requests import path_arg, query_bool, query_int, read_json
from ...web.server import add_routes, base_app
from .. import jobtable, opkey, presence, shared, targetauth, targetstats
from ..cache.service import CacheService
from ..listing import wire_entries
from ..multipart import MultipartService
from ..service import MetaService
from ..store.base import Upload
from ..store.factory import open_store
from ..upkeep import reliability
from ..upkeep.garbage import collect_garbage
from . import authapp, gauges, heartbeats, quotas, ui
from . import cache as cachehttp
from . import multipart as mphttp
from . import s3keys as s3keyhttp
from .authapp import check_uploads, read_capability, write_capability
from .gateway import Gateway

log = logging.getLogger("stager.meta")
SERVICE = web.AppKey("service", MetaService)
GATEWAY = web.AppKey("gateway", Gateway)
CONFIG = web.AppKey("config", Config)
STREAM_PIECE = 1 << 20


def make_meta_app(config: Config) -> web.Application:
    service = MetaService(open_store(config), config)

    async def cluster_gauges(metrics: ServerMetrics) -> None:
        gauges.refresh(metrics, service, app[targetstats.RATES],
                       app[reliability.RELIABILITY].status()["rebuild"])

    app = base_app("meta", client_max_size=config.max_json_body, identity={},
                   refresh_metrics=cluster_gauges)
    app[CONFIG] = config
    app[SERVICE] = service
    add_routes(app, "meta", {**HANDLERS, **authapp.handlers(service, config)})
    authapp.install(app, service, config)   # tokens, when config.auth
    s3keyhttp.install(app, service, config)  # S3 keys, when config.auth (after authapp)
    # after auth, so that a key answers only its owner; opkey: creates and commits retried
    idempotency.install(app, service.store, bind=opkey.bind,
                        self_answering=opkey.SELF_ANSWERING)
    app.cleanup_ctx.append(_data_plane)
    shared.install(app, service, config)     # a store other metadata servers share
    presence.install(app, service, config)   # the SQLite lock; or this server's record
    app.cleanup_ctx.append(_background)
    # rebuild, repair, scrub, fsck: after _data_plane, whose plane they use
    reliability.install(app, service, config, lambda: app[GATEWAY].plane)
    jobtable.install(app, service.store)    # live loader telemetry (the list_jobs route)
    targetstats.install(app, service)        # per-target rates, from heartbeats
    quotas.install(app, service.quotas)      # directory quotas and pins
    # attached directories: fills, and the duty holder's refreshes and evictions
    cachehttp.install(app, CacheService(service, config, lambda: app[GATEWAY].plane))
    app.cleanup_ctx.append(cachehttp.background(config.cache_interval))
    # S3 multipart uploads, and the collection of idle ones (stager/meta/multipart.py)
    mphttp.install(app, MultipartService(service))
    app.cleanup_ctx.append(mphttp.background(lambda: config.gc_interval))
    return app


async def _data_plane(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG]
    await app[SERVICE].start()      # the registered targets, before anything serves
    options = PlaneOptions.of(config)
    session = make_session(options)
    auth = app.get(authapp.AUTH)
    credentials = ServerCredential(auth.server_capability) if auth is not None else None
    filler = app[cachehttp.CACHE].filler

    async def fill(items: Sequence[FillItem]) -> list[Filled | StagerError]:
        return await filler.fill(items, lambda path: True)   # the route checked the path

    app[GATEWAY] = Gateway(app[SERVICE], DataPlane(session, options, credentials=credentials,
                                                   filler=fill), config)
    yield
    await session.close()
    # Closing the store joins its thread and checkpoints the SQLite WAL (an fsync):
    # off the loop, which still closes other servers' connections meanwhile.
    await asyncio.to_thread(app[SERVICE].close)


async def _background(app: web.Application) -> AsyncIterator[None]:
    """Health checks and garbage collection, for as long as the server runs."""
    service, gateway, config = app[SERVICE], app[GATEWAY], app[CONFIG]

    async def purge(target: TargetInfo, file_ids: list[str]) -> int:
        return await gateway.plane.purge(target.id, target.url, file_ids)

    async def loop() -> None:
        while True:
            await asyncio.sleep(min(config.gc_interval, config.heartbeat_interval))
            service.refresh_health()
            if not service.duties_held:     # another metadata server collects
                continue
            try:
                await collect_garbage(service, purge)
            except Unavailable as exc:      # the metadata database is down: said once a round
                log.warning("garbage collection: %s; will retry", exc)
            except Exception:
                log.exception("garbage collection failed; will retry")

    task = asyncio.create_task(loop())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _svc(request: web.Request) -> MetaService:
    return request.app[SERVICE]


async def _body(request: web.Request) -> dict[str, object]:
    return await read_json(request, request.app[CONFIG].max_json_body)


# -- cluster ---------------------------------------------------------------------------
async def status(request: web.Request) -> web.Response:
    status = await _svc(request).status()
    status.sections.update(quotas.readable_sections(request, status.sections))
    return json_response(status.to_json())


async def list_targets(request: web.Request) -> web.Response:
    return json_response(m.TargetList(tuple(_svc(request).list_targets())).to_json())


async def register_target(request: web.Request) -> web.Response:
    target = TargetInfo.from_json(await _body(request))
    stored, credential = await targetauth.register(
        authapp.auth_of(request), _svc(request), request.app[CONFIG], token_of(request),
        target)
    return json_response(TargetRegistered(stored, credential).to_json())


async def heartbeat(request: web.Request) -> web.Response:
    speak_for(request, request.match_info["target_id"])
    beat = m.Heartbeat.from_json(await _body(request))
    target = await _svc(request).heartbeat(request.match_info["target_id"],
                                           capacity=beat.capacity, used=beat.used,
                                           chunks=beat.chunks)
    targetstats.observe(request, target.id, beat)
    return json_response(target.to_json())


async def leave_target(request: web.Request) -> web.Response:
    speak_for(request, request.match_info["target_id"])
    target = await _svc(request).leave(request.match_info["target_id"])
    return json_response(target.to_json())


async def forget_target(request: web.Request) -> web.Response:
    target = await targetauth.forget(authapp.auth_of(request), _svc(request),
                                     request.match_info["target_id"])
    return json_response(target.to_json())


# -- namespace -------------------------------------------------------------------------
async def stat(request: web.Request) -> web.Response:
    svc = _svc(request)
    # straight from the store's row to the answer's bytes, as a listing's entries are:
    # FileInfo.to_json's object, without the FileInfo (stager/meta/listing.py)
    [entry] = wire_entries([await svc.stat_row(path_arg(request))], svc.locations)
    if entry.type != "directory":
        authorize(request, "read", entry.path)
        entry.capability = read_capability(request, entry.file_id)
    return web.Response(body=encode_json(entry, entry.to_json), content_type="application/json")


def _readable(request: web.Request, info: FileInfo) -> None:
    """A file's stat needs read on its path; a directory's is seen walking down to a
    covered prefix (the route's rule, ``visible``, admitted that much)."""
    if not info.is_dir:
        authorize(request, "read", info.path)


async def list_dir(request: web.Request) -> web.Response:
    path = path_arg(request)
    after, limit = request.query.get("after", ""), query_int(request, "limit")
    layouts: list[msgspec.Raw] | None = [] if wants_shared(request.query.get("layouts")) else None
    token = token_of(request)
    svc = _svc(request)
    while True:
        rows, nxt = await svc.list_page(path, after=after, limit=limit)
        if token is None:
            break
        # Only what the token's prefixes lead to, and a cursor that names no other
        # entry (a page of hidden ones once handed back the last one's name): the last
        # entry shown, or past a page with none shown, the next page.
        rows = [r for r in rows if visible(token, r[0])]
        if nxt is None or rows:
            nxt = nxt and rows[-1][0].rsplit("/", 1)[-1]
            break
        after = nxt
    # straight from the rows to the page's bytes (stager/meta/listing.py)
    entries = wire_entries(rows, svc.locations, layouts)
    body = listing_body(path, entries, nxt, detail=query_bool(request, "detail", True),
                        layouts=layouts)
    return web.Response(body=body, content_type="application/json")


async def mkdir(request: web.Request) -> web.Response:
    req = m.MkdirRequest.from_json(await _body(request))
    authorize(request, "write", req.path)
    info = await _svc(request).mkdir(req.path, parents=req.parents, exist_ok=req.exist_ok,
                                     layout=req.layout)
    return json_response(info.to_json())


async def set_layout(request: web.Request) -> web.Response:
    req = m.SetLayoutRequest.from_json(await _body(request))
    authorize(request, "write", req.path)
    return json_response((await _svc(request).set_layout(req.path, req.layout)).to_json())


# -- writes: each a batch (stager/protocol/batch.py, stager/meta/writes.py) --------------
async def create(request: web.Request) -> web.Response:
    items = parse_items(await _body(request), CreateItem.from_json, key=lambda i: i.path)
    for item in items:
        authorize(request, "write", item.path)
    results = await _svc(request).create(items)
    return json_response(results_json(results, lambda r: _upload(request, *r).to_json()))


async def commit(request: web.Request) -> web.Response:
    items = parse_items(await _body(request), CommitItem.from_json, key=lambda i: i.file_id)
    await check_uploads(request, _svc(request), [i.file_id for i in items])
    results = await _svc(request).commit(items)
    return json_response(results_json(results, FileInfo.to_json))


async def abort(request: web.Request) -> web.Response:
    file_ids = parse_items(await _body(request), check_file_id, key=str, name="file_ids")
    await check_uploads(request, _svc(request), file_ids)
    results = await _svc(request).abort(file_ids)
    return json_response(results_json(results, lambda r: None))


async def reroute(request: web.Request) -> web.Response:
    req = m.RerouteRequest.from_json(await _body(request))
    await check_uploads(request, _svc(request), [i.file_id for i in req.items])
    results = await _svc(request).reroute(req)
    return json_response(results_json(results, lambda r: _upload(request, *r).to_json()))


def _upload(request: web.Request, upload: Upload, info: FileInfo) -> m.Upload:
    assert info.layout is not None
    return m.Upload(upload.file_id, upload.path, info.layout, info.locations,
                    write_capability(request, upload.file_id))


async def rename(request: web.Request) -> web.Response:
    req = m.RenameRequest.from_json(await _body(request))
    authorize(request, "write", req.src)
    authorize(request, "write", req.dst)
    info = await _svc(request).rename(req.src, req.dst, overwrite=req.overwrite)
    return json_response(info.to_json())


async def remove(request: web.Request) -> web.Response:
    req = m.RemoveRequest.from_json(await _body(request))
    authorize(request, "write", req.path)
    removed = await _svc(request).remove(req.path, recursive=req.recursive)
    return json_response(m.RemoveResult(removed).to_json())


async def put_manifest(request: web.Request) -> web.Response:
    body = await read_json(request, request.app[CONFIG].max_manifest_size)
    count = await _svc(request).put_manifest(path_arg(request), body)
    return json_response(m.ManifestStored(path_arg(request), count).to_json())


async def get_manifest(request: web.Request) -> web.Response:
    """The resolved manifest, from the service's cache: gzip'd as cached when the
    client takes gzip (plain JSON for curl), 304 when ``If-None-Match`` names it."""
    service, path = _svc(request), path_arg(request)
    wanted = request.headers.get("If-None-Match")
    if wanted is not None:
        etag = await service.manifest_etag(path)
        if etag_matches(wanted, etag):
            return web.Response(status=304, headers={"ETag": etag})
    snapshot = await service.get_manifest(path)
    headers = {"ETag": snapshot.etag, "Vary": "Accept-Encoding"}
    if accepts_gzip(request.headers.get("Accept-Encoding", "")):
        headers["Content-Encoding"] = "gzip"
        return web.Response(body=snapshot.gzipped, content_type="application/json",
                            headers=headers)
    # Megabytes to inflate: in a thread, so the loop serves the other requests.
    return web.Response(body=await asyncio.to_thread(snapshot.json_bytes),
                        content_type="application/json", headers=headers)


# -- whole-file gateway ----------------------------------------------------------------
def _file_headers(size: int, mtime: float, file_id: str | None) -> dict[str, str]:
    return {"Accept-Ranges": "bytes", "Last-Modified": formatdate(mtime, usegmt=True),
            "ETag": f'"{file_id}"', "Content-Type": "application/octet-stream"}


async def gateway_get(request: web.Request) -> web.StreamResponse:
    path = path_arg(request)
    info = await _svc(request).stat(path)
    if info.is_dir:
        return await list_dir(request)
    _readable(request, info)
    try:
        span = parse_range(request.headers.get("Range"), info.size)
    except RangeNotSatisfiable as exc:
        return error_response(exc, headers={"Content-Range": unsatisfied_range(info.size)})
    start, stop = span or (0, info.size)
    headers = _file_headers(info.size, info.mtime, info.file_id)
    response = web.StreamResponse(status=206 if span else 200, headers=headers)
    if span:
        response.headers["Content-Range"] = content_range(start, stop, info.size)
    response.content_length = stop - start
    pieces = request.app[GATEWAY].reader(info).stream(start, stop)
    # Fetch the first piece before sending headers, so a dead target is still a 503.
    first = await anext(pieces, None)
    await response.prepare(request)
    sent = 0
    if first is not None:
        await response.write(first)
        sent += len(first)
        async for piece in pieces:
            await response.write(piece)
            sent += len(piece)
    request.app[METRICS_KEY].sent("gateway", sent)
    await response.write_eof()
    return response


async def gateway_head(request: web.Request) -> web.StreamResponse:
    info = await _svc(request).stat(path_arg(request))
    if info.is_dir:
        return web.Response(headers={"Content-Type": "application/json"})
    # web.Response refuses a content_length assignment; an explicit header is kept on HEAD.
    headers = _file_headers(info.size, info.mtime, info.file_id)
    headers["Content-Length"] = str(info.size)
    return web.Response(headers=headers)


async def gateway_put(request: web.Request) -> web.Response:
    config = request.app[CONFIG]
    if request.content_length is not None and request.content_length > config.max_upload_size:
        raise PayloadTooLarge(f"body over the limit of {config.max_upload_size} bytes",
                              limit=config.max_upload_size)
    spec = LayoutSpec(chunk_size=query_int(request, "chunk_size"),
                      stripe_count=query_int(request, "stripe_count"),
                      replicas=query_int(request, "replicas"))
    spec.validate(config.max_chunk_size)

    size = request.content_length
    body: AsyncIterator[bytes] | bytes
    if size is not None and size <= STREAM_PIECE:
        # a body no longer than one piece (a small file's), read whole: its bytes are
        # in already, and two async generators stepped per piece cost more than it
        body = await request.content.read()
    else:
        async def pieces() -> AsyncIterator[bytes]:
            async for piece in request.content.iter_chunked(STREAM_PIECE):
                yield piece
        body = pieces()

    info = await request.app[GATEWAY].write(path_arg(request), body, layout=spec,
                                            max_size=config.max_upload_size, size=size)
    request.app[METRICS_KEY].received("gateway", info.size)
    return json_response(info.to_json(), status=201)


async def gateway_delete(request: web.Request) -> web.Response:
    removed = await _svc(request).remove(path_arg(request),
                                         recursive=query_bool(request, "recursive"))
    return json_response(m.RemoveResult(removed).to_json())


HANDLERS = {
    "status": status, "list_targets": list_targets, "register_target": register_target,
    "heartbeat": heartbeat, "leave_target": leave_target, "forget_target": forget_target,
    "stat": stat, "list": list_dir,
    "mkdir": mkdir,
    "set_layout": set_layout, "create": create, "commit": commit, "abort": abort,
    "reroute": reroute,
    "rename": rename, "remove": remove, "put_manifest": put_manifest,
    "get_manifest": get_manifest, "gateway_get": gateway_get,
    "gateway_head": gateway_head, "gateway_put": gateway_put,
    "gateway_delete": gateway_delete, **reliability.HANDLERS, **jobtable.HANDLERS,
    **ui.HANDLERS, **quotas.HANDLERS, **cachehttp.HANDLERS, **s3keyhttp.HANDLERS,
    **mphttp.HANDLERS,
}
HANDLERS.update(heartbeats.HANDLERS)    # batched heartbeats (stager/meta/http/heartbeats.py)
