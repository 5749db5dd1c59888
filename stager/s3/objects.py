"""Objects: HeadObject, GetObject, PutObject, CopyObject, DeleteObject(s).

An object is a stager file; its bytes stream from and to the data servers through
the client's read and write engines (``client.reader(info).stream``,
``client.write_stream``), never whole in memory.  A PUT's body is checked as it
streams (:mod:`.payload`); a fault aborts the write, so nothing becomes visible.

Keys ending in ``/`` (the empty "folder" objects of S3 consoles) are
directories: PUT of ``a/b/`` with an empty body makes the directory ``a/b``, HEAD
and GET of it answer an empty object while the directory exists, DELETE removes
it when it is empty.  A key is either an object or a prefix of others, never both
(``a`` and ``a/b`` cannot both be objects): the second PUT is refused with
``InvalidRequest``.  Directories above a key are made by its PUT and removed by
the DELETE that empties them, as S3's prefixes come and go with their keys.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from dataclasses import replace
from email.utils import parsedate_to_datetime
from typing import Any

from aiohttp import web

from ..client import AsyncClient
from ..dataplane import StripedReader
from ..errors import DirectoryNotEmpty, NotFound, RangeNotSatisfiable, StagerError
from ..protocol import paths
from ..protocol.models import FileInfo
from ..protocol.ranges import content_range, parse_range
from . import xml
from .attrs import DEFAULT_TYPE, ObjectAttrs, attrs_of, fits
from .buckets import bucket_info, xml_response
from .context import S3Context
from .errors import S3Error, from_stager
from .names import bucket_path, check_bucket, decode_path, object_path
from .payload import hashed

EMPTY_ETAG = '"d41d8cd98f00b204e9800998ecf8427e"'
MAX_METADATA = 2048          # bytes of x-amz-meta-* (S3's limit)
KEPT_HEADERS = ("Content-Encoding", "Content-Disposition", "Cache-Control",
                "Content-Language", "Expires")
RESPONSE_OVERRIDES = {"response-content-type": "Content-Type",
                      "response-content-disposition": "Content-Disposition",
                      "response-content-encoding": "Content-Encoding",
                      "response-content-language": "Content-Language",
                      "response-cache-control": "Cache-Control",
                      "response-expires": "Expires"}
DELETE_CONCURRENCY = 16
HEAD_SLICE = 16 * 1024      # a GET's first slice of body, joined to the answer's head


# -- what a request names ------------------------------------------------------------------
async def find(ctx: S3Context, bucket: str, key: str) -> tuple[FileInfo, ObjectAttrs]:
    """The object ``bucket/key`` and its attributes; ``NoSuchKey`` / ``NoSuchBucket``."""
    path = object_path(bucket, key)
    try:
        info = await ctx.client.stat(path, cached=False)
    except NotFound:
        info = None
    folder = key.endswith("/")
    if info is None or info.is_dir != folder:
        await bucket_info(ctx.client, bucket)
        raise S3Error("NoSuchKey", "the specified key does not exist",
                      resource=f"/{bucket}/{key}")
    return info, ObjectAttrs(etag=EMPTY_ETAG) if folder else attrs_of(info)


def object_headers(info: FileInfo, attrs: ObjectAttrs) -> dict[str, str]:
    headers = {"ETag": attrs.etag, "Last-Modified": xml.http_date(info.mtime),
               "Content-Type": attrs.content_type, "Accept-Ranges": "bytes"}
    headers.update(attrs.extra)
    for name, value in attrs.metadata.items():
        headers[f"x-amz-meta-{name}"] = value
    if attrs.parts:
        headers["x-amz-mp-parts-count"] = str(attrs.parts)
    return headers


def _when(text: str) -> float | None:
    try:
        return parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, IndexError):
        return None     # S3 ignores a date it cannot read


def _etag_matches(header: str, etag: str) -> bool:
    wanted = [t.strip() for t in header.split(",")]
    return "*" in wanted or etag in wanted or etag.strip('"') in wanted


def check_conditions(headers: web.CIMultiDictProxy[str], info: FileInfo,  # type: ignore[name-defined]
                     attrs: ObjectAttrs, prefix: str = "") -> bool:
    """RFC 7232 as S3 applies it; ``False``: answer 304 Not Modified.  ``prefix``:
    ``x-amz-copy-source-`` for CopyObject's conditions on its source (no 304: 412)."""
    mtime = int(info.mtime)
    match, none_match = headers.get(prefix + "If-Match"), headers.get(prefix + "If-None-Match")
    if match is not None:
        if not _etag_matches(match, attrs.etag):
            raise S3Error("PreconditionFailed", "At least one of the pre-conditions you "
                          "specified did not hold", headers={"ETag": attrs.etag})
    elif (since := _when(headers.get(prefix + "If-Unmodified-Since", ""))) is not None:
        if mtime > since:
            raise S3Error("PreconditionFailed", "the object was modified since "
                          "If-Unmodified-Since")
    if none_match is not None:
        if _etag_matches(none_match, attrs.etag):
            if prefix:
                raise S3Error("PreconditionFailed", "the source matches If-None-Match")
            return False
    elif (since := _when(headers.get(prefix + "If-Modified-Since", ""))) is not None:
        if mtime <= since:
            if prefix:
                raise S3Error("PreconditionFailed", "the source is not modified since")
            return False
    return True


def _span(ctx: S3Context, info: FileInfo, attrs: ObjectAttrs) -> tuple[int, int] | None:
    """The bytes asked for (``Range`` or ``partNumber``); ``None``: all of them."""
    part = ctx.query.get("partNumber")
    rng = ctx.headers.get("Range")
    if part is not None:
        if rng is not None:
            raise S3Error("InvalidRequest", "Range and partNumber together")
        if not (part.isascii() and part.isdigit()) or not 1 <= int(part) <= 10000:
            raise S3Error("InvalidArgument", "partNumber is an integer from 1 to 10000")
        if attrs.parts and not attrs.part_sizes:
            raise S3Error("NotImplemented", "this object's part sizes are not kept (too "
                          "many sizes to keep with it): read it by Range")
        sizes = attrs.part_sizes or (info.size,)
        n = int(part)
        if n > len(sizes):
            raise S3Error("InvalidPartNumber", "the requested partnumber is not satisfiable")
        start = sum(sizes[:n - 1])
        return (start, start + sizes[n - 1]) if attrs.parts else None
    try:
        return parse_range(rng, info.size)
    except RangeNotSatisfiable:
        raise S3Error("InvalidRange", "The requested range is not satisfiable",
                      headers={"Content-Range": f"bytes */{info.size}"}) from None


async def _prelude(ctx: S3Context) -> tuple[FileInfo, ObjectAttrs, dict[str, str],
                                            tuple[int, int] | None, bool]:
    info, attrs = await find(ctx, ctx.bucket, ctx.key)
    headers = object_headers(info, attrs)
    if not check_conditions(ctx.headers, info, attrs):
        return info, attrs, headers, None, False
    span = _span(ctx, info, attrs)
    for q, header in RESPONSE_OVERRIDES.items():
        if q in ctx.query:
            headers[header] = ctx.query[q]
    if span is None and ctx.headers.get("x-amz-checksum-mode", "").upper() == "ENABLED":
        for alg, value in attrs.checksums.items():
            headers[f"x-amz-checksum-{alg}"] = value
    return info, attrs, headers, span, True


def _not_modified(headers: dict[str, str]) -> web.Response:
    keep = {k: v for k, v in headers.items() if k in ("ETag", "Last-Modified")}
    return web.Response(status=304, headers=keep)


async def head_object(ctx: S3Context) -> web.StreamResponse:
    info, _, headers, span, fresh = await _prelude(ctx)
    if not fresh:
        return _not_modified(headers)
    start, stop = span or (0, info.size)
    headers["Content-Length"] = str(stop - start)
    if span:
        headers["Content-Range"] = content_range(start, stop, info.size)
    return web.Response(status=206 if span else 200, headers=headers)


async def get_object(ctx: S3Context) -> web.StreamResponse:
    info, _, headers, span, fresh = await _prelude(ctx)
    if not fresh:
        return _not_modified(headers)
    start, stop = span or (0, info.size)
    response = web.StreamResponse(status=206 if span else 200, headers=headers)
    if span:
        response.headers["Content-Range"] = content_range(start, stop, info.size)
    response.content_length = stop - start
    response.headers["x-amz-request-id"] = response.headers["x-amz-id-2"] = ctx.request_id
    if info.is_dir or stop == start:
        await response.prepare(ctx.request)
        await response.write_eof()
        return response
    reader = ctx.client.reader(info)
    # A whole object has no range to read on for (:mod:`stager.dataplane.tails`): its
    # pieces are lent, and handed back once sent, so no 4 MiB buffer is made (zeroed,
    # faulted in) per chunk.
    lend = span is None
    pieces = reader.stream(start, stop, lend=lend)
    # The first piece before the headers: a dead target is still an S3 error answer.
    first = await anext(pieces)
    await response.prepare(ctx.request)
    try:
        await _write_first(response, first)
        sent = first
        async for piece in pieces:
            await response.write(piece)
            if lend:
                _hand_back(ctx.request, reader, sent, piece)
            sent = piece
    except StagerError as exc:
        # Too late for an error answer: the connection is cut, so the client sees a
        # short body, never a whole-looking wrong one.
        await pieces.aclose()  # type: ignore[attr-defined]
        raise ConnectionResetError(f"the read failed midway: {exc}") from exc
    await response.write_eof()
    return response


async def _write_first(response: web.StreamResponse, piece: memoryview) -> None:
    """Send an answer's first piece.  The first write is joined to the answer's head
    (aiohttp does so before Python 3.12.9): a 4 MiB piece written whole was copied
    once more per GET (of a ranged GET of 8 MiB, half its bytes), so the head goes
    with a small slice of it and the rest straight to the socket."""
    await response.write(piece[:HEAD_SLICE])
    if len(piece) > HEAD_SLICE:
        await response.write(piece[HEAD_SLICE:])


def _hand_back(request: web.Request, reader: StripedReader, sent: memoryview,
               last: memoryview) -> None:
    """Give ``sent`` back to ``reader`` once the connection holds none of it: the
    transport keeps what it could not send yet (Python 3.12's as views of our buffer,
    not copies), and ``last`` was written after ``sent``, so fewer bytes buffered
    than ``last`` has mean all of ``sent`` is out.  Otherwise it is left to the
    garbage collector."""
    transport = request.transport
    if transport is None or transport.get_write_buffer_size() > len(last):
        return
    try:
        reader.give_back(sent)
    except BufferError:
        pass        # something still views it: not ours to reuse


# -- writing ---------------------------------------------------------------------------
def request_attrs(ctx: S3Context, etag: str = EMPTY_ETAG,
                  checksums: dict[str, str] | None = None) -> ObjectAttrs:
    """The attributes a PUT (or a multipart create) declares in its headers; refused
    when they are over S3's bound on ``x-amz-meta-*`` or a file version's on all."""
    metadata = {k[len("x-amz-meta-"):].lower(): v for k, v in ctx.headers.items()
                if k.lower().startswith("x-amz-meta-")}
    if sum(len(k) + len(v) for k, v in metadata.items()) > MAX_METADATA:
        raise S3Error("MetadataTooLarge", f"x-amz-meta-* is over {MAX_METADATA} bytes")
    extra = {h: ctx.headers[h] for h in KEPT_HEADERS if h in ctx.headers}
    encoding = ",".join(e for e in (s.strip() for s in extra.get("Content-Encoding", "")
                                    .split(",")) if e and e != "aws-chunked")
    extra.pop("Content-Encoding", None)
    if encoding:
        extra["Content-Encoding"] = encoding
    attrs = ObjectAttrs(etag=etag, content_type=ctx.headers.get("Content-Type") or DEFAULT_TYPE,
                        metadata=metadata, checksums=checksums or {}, extra=extra)
    if not fits(attrs):
        raise S3Error("MetadataTooLarge", "the object's Content-Type, x-amz-meta-* and "
                      "kept headers are over the bound of what stager keeps with it")
    return attrs


async def put_object(ctx: S3Context) -> web.StreamResponse:
    path = object_path(ctx.bucket, ctx.key)
    await bucket_info(ctx.client, ctx.bucket)
    payload = ctx.payload()
    if ctx.key.endswith("/"):
        return await _put_folder(ctx, path, payload.stream())
    request_attrs(ctx)          # metadata refused before any byte is written
    if_none_match = ctx.headers.get("If-None-Match")
    if if_none_match not in (None, "*"):
        raise S3Error("NotImplemented", "a PUT's If-None-Match takes only *")
    try:
        # If-None-Match: * (a conditional write): only where no object is, checked at
        # the create and again at the commit, so of two such writers one wins
        info = await ctx.client.write_stream(
            path, payload.stream(), overwrite=if_none_match is None,
            attrs=lambda: request_attrs(ctx, f'"{payload.md5}"', payload.checksums).stored())
    except StagerError as exc:
        if exc.code == "exists" and if_none_match == "*":
            raise S3Error("PreconditionFailed", "an object of this key exists "
                          "(If-None-Match: *)", resource=f"/{ctx.bucket}/{ctx.key}") from None
        raise _write_error(exc, ctx) from None
    headers = {"ETag": attrs_of(info).etag}
    for alg, value in payload.checksums.items():
        headers[f"x-amz-checksum-{alg}"] = value
    return web.Response(headers=headers)


def _write_error(exc: StagerError, ctx: S3Context) -> S3Error:
    if exc.code in ("is_a_directory", "not_a_directory", "exists"):
        return S3Error("InvalidRequest", f"{ctx.key!r} is both an object and a prefix of "
                       f"other keys here, which stager cannot hold ({exc.message})",
                       resource=f"/{ctx.bucket}/{ctx.key}")
    return from_stager(exc, f"/{ctx.bucket}/{ctx.key}")


async def _put_folder(ctx: S3Context, path: str, body: AsyncIterator[bytes]) -> web.Response:
    async for piece in body:
        if piece:
            raise S3Error("InvalidArgument", "a key ending in / is a directory here and "
                          "holds no bytes", resource=f"/{ctx.bucket}/{ctx.key}")
    try:
        await ctx.client.mkdir(path, parents=True, exist_ok=True)
    except StagerError as exc:
        raise _write_error(exc, ctx) from None
    return web.Response(headers={"ETag": EMPTY_ETAG})


def copy_source(ctx: S3Context) -> tuple[str, str]:
    """``x-amz-copy-source``'s bucket and key."""
    raw = ctx.headers["x-amz-copy-source"]
    text, _, version = raw.partition("?")
    if version and version not in ("versionId=null",):
        raise S3Error("NotImplemented", "versions are not supported")
    text = decode_path(text)       # as strict as a request path: InvalidURI
    bucket, _, key = (text[1:] if text.startswith("/") else text).partition("/")
    if not bucket or not key:
        raise S3Error("InvalidArgument", "x-amz-copy-source is not BUCKET/KEY")
    return check_bucket(bucket), key


async def copy_object(ctx: S3Context) -> web.StreamResponse:
    src_bucket, src_key = copy_source(ctx)
    path = object_path(ctx.bucket, ctx.key)
    await bucket_info(ctx.client, ctx.bucket)
    info, attrs = await find(ctx, src_bucket, src_key)
    check_conditions(ctx.headers, info, attrs, prefix="x-amz-copy-source-")
    directive = ctx.headers.get("x-amz-metadata-directive", "COPY").upper()
    if directive not in ("COPY", "REPLACE"):
        raise S3Error("InvalidArgument", "x-amz-metadata-directive is COPY or REPLACE")
    if directive == "COPY" and (src_bucket, src_key) == (ctx.bucket, ctx.key):
        raise S3Error("InvalidRequest", "This copy request is illegal because it is trying "
                      "to copy an object to itself without changing the object's metadata")
    if info.is_dir or ctx.key.endswith("/"):
        raise S3Error("InvalidRequest", "a directory (a key ending in /) is not copied")
    md5 = hashlib.md5()
    declared = request_attrs(ctx) if directive == "REPLACE" else None

    async def pieces() -> AsyncIterator[bytes]:
        # Each piece is copied out of a lent buffer (handed back at once: no chunk
        # buffer zero-filled per chunk); its MD5 is made on a thread while it is
        # written (hashed): on the event loop it held every other request 5 ms per 4 MiB.
        reader = ctx.client.reader(info)
        async for piece in reader.stream(0, info.size, lend=True):
            data = bytes(piece)
            reader.give_back(piece)
            yield data

    def made() -> dict[str, Any]:
        etag = f'"{md5.hexdigest()}"'
        if declared is not None:
            return replace(declared, etag=etag).stored()
        # a copy is one object, no parts: its checksums only where they were of the whole
        return replace(attrs, etag=etag, checksums={} if attrs.parts else attrs.checksums,
                       parts=0, part_sizes=()).stored()

    try:
        new = await ctx.client.write_stream(path, hashed(pieces(), [{"md5": md5}]),
                                             attrs=made)
    except StagerError as exc:
        raise _write_error(exc, ctx) from None
    body = xml.document("CopyObjectResult", [("LastModified", xml.iso(new.mtime)),
                                             ("ETag", attrs_of(new).etag)])
    return xml_response(body)


# -- deleting --------------------------------------------------------------------------
async def remove(client: AsyncClient, ctx: S3Context, key: str) -> None:
    """Delete ``key`` of ``ctx.bucket`` (no error when there is none), then the
    directories above it that it left empty, up to the bucket."""
    path = object_path(ctx.bucket, key)
    try:
        info = await client.stat(path, cached=False)
    except NotFound:
        return
    if info.is_dir != key.endswith("/"):
        return
    try:
        await client.rm(path, recursive=False)
    except (NotFound, DirectoryNotEmpty):
        return          # gone meanwhile; a folder that holds keys stays (their prefix)
    parent = paths.split(path)[0]
    while parent != bucket_path(ctx.bucket):
        try:
            await client.rm(parent, recursive=False)
        except StagerError:
            break       # not empty (or gone): it stays, and so do those above it
        parent = paths.split(parent)[0]


async def delete_object(ctx: S3Context) -> web.StreamResponse:
    object_path(ctx.bucket, ctx.key)
    try:
        await remove(ctx.client, ctx, ctx.key)
    except NotFound:
        pass
    if not await ctx.client.exists(bucket_path(ctx.bucket)):
        raise S3Error("NoSuchBucket", "the bucket does not exist", resource=f"/{ctx.bucket}")
    return web.Response(status=204)


async def delete_objects(ctx: S3Context) -> web.StreamResponse:
    await bucket_info(ctx.client, ctx.bucket)
    body = bytearray()
    async for piece in ctx.payload().stream():
        body += piece
        if len(body) > xml.MAX_BODY:
            raise S3Error("MalformedXML", "the XML body is too large")
    keys, quiet = xml.parse_delete(bytes(body))
    limit = asyncio.Semaphore(DELETE_CONCURRENCY)

    async def one(key: str) -> xml.Node:
        async with limit:
            try:
                await remove(ctx.client, ctx, key)
            except S3Error as exc:
                return ("Error", (("Key", key), ("Code", exc.code), ("Message", exc.message)))
            except StagerError as exc:
                err = from_stager(exc)
                return ("Error", (("Key", key), ("Code", err.code), ("Message", err.message)))
        return None if quiet else ("Deleted", (("Key", key),))

    results = await asyncio.gather(*(one(k) for k in keys))
    return xml_response(xml.document("DeleteResult", results))
