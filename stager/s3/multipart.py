"""S3 multipart uploads: CreateMultipartUpload, UploadPart(Copy), Complete, Abort, ListParts,
ListMultipartUploads, over :class:`~stager.client.uploads.MultipartUploads`.

The design is the metadata server's (:mod:`stager.meta.multipart`): parts whose size
allows it (boto3's and the AWS CLI's equal 8 MiB parts, the last shorter) are written
straight into the final file's chunks, so completing copies nothing; other part
layouts are composed by a streaming copy at completion.  A part streams from the
request body (decoded and checked by :meth:`~stager.s3.context.S3Context.payload`)
into the write engine: memory stays near a few chunks whatever the part size.

What CreateMultipartUpload declares (Content-Type, ``x-amz-meta-*``) is kept with the
upload on the metadata server (its ``extra``); the completion commits the object's file
with those attributes (:mod:`.attrs`), S3's multipart ETag and its part sizes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from aiohttp import web

from ..client.uploads import MultipartUploads
from ..errors import BadRequest, StagerError, UploadNotFound
from ..protocol.multipart import MAX_PART_NUMBER, MultipartUpload, PartList
from .attrs import ObjectAttrs
from .buckets import bucket_info, xml_response
from .context import S3Context
from .errors import STATUS, S3Error, from_stager
from .names import key_of, object_path
from .objects import check_conditions, copy_source, find, request_attrs
from .xml import children, document, iso, parse, text_of

MAX_COMPLETE_BODY = 2 << 20       # 10,000 parts of ~100 bytes each
MAX_LISTED = 1000
MAX_PART = 5 << 30               # S3's largest part


def _ascii_digits(text: str) -> bool:
    """A decimal number S3 would read: ASCII digits only (str.isdigit passes '²' and '١')."""
    return text.isascii() and text.isdigit()


def s3_error(exc: StagerError, ctx: S3Context) -> S3Error:
    """A stager error of a multipart call as S3 names it: a refused completion by its
    reason (InvalidPart, …), a missing upload as NoSuchUpload."""
    resource = f"/{ctx.bucket}/{ctx.key}"
    reason = exc.details.get("reason")
    if isinstance(exc, BadRequest) and isinstance(reason, str) and reason in STATUS:
        return S3Error(reason, exc.message, resource=resource)
    if isinstance(exc, UploadNotFound):
        return S3Error("NoSuchUpload", "the specified multipart upload does not exist",
                       resource=resource)
    return from_stager(exc, resource)


def _upload_id(ctx: S3Context) -> str:
    text = ctx.query.get("uploadId", "")
    if len(text) != 32 or any(c not in "0123456789abcdef" for c in text):
        raise S3Error("NoSuchUpload", "the specified multipart upload does not exist",
                      resource=f"/{ctx.bucket}/{ctx.key}")
    return text


def _part_number(ctx: S3Context) -> int:
    text = ctx.query.get("partNumber", "")
    if not _ascii_digits(text) or not 1 <= int(text) <= MAX_PART_NUMBER:
        raise S3Error("InvalidArgument", f"Part number must be an integer between 1 and "
                      f"{MAX_PART_NUMBER}, inclusive", resource=f"/{ctx.bucket}/{ctx.key}")
    return int(text)


async def _parts_of(ctx: S3Context, upload_id: str) -> PartList:
    """The upload and its parts; NoSuchUpload unless it is this request's key's."""
    try:
        listed = await MultipartUploads(ctx.client).parts(upload_id)
    except StagerError as exc:
        raise s3_error(exc, ctx) from None
    if listed.upload.path != object_path(ctx.bucket, ctx.key):
        raise S3Error("NoSuchUpload", "the specified multipart upload does not exist",
                      resource=f"/{ctx.bucket}/{ctx.key}")
    return listed


async def create_upload(ctx: S3Context) -> web.StreamResponse:
    path = object_path(ctx.bucket, ctx.key)
    await bucket_info(ctx.client, ctx.bucket)
    if ctx.key.endswith("/"):
        raise S3Error("InvalidArgument", "a key ending in / is a directory here and holds "
                      "no bytes", resource=f"/{ctx.bucket}/{ctx.key}")
    declared = request_attrs(ctx)      # refused here, before any part
    try:
        upload = await MultipartUploads(ctx.client).create(
            path, extra=json.dumps(declared.to_json()))
    except StagerError as exc:
        raise s3_error(exc, ctx) from None
    return xml_response(document("InitiateMultipartUploadResult", [
        ("Bucket", ctx.bucket), ("Key", ctx.key), ("UploadId", upload.upload_id)]))


async def upload_part(ctx: S3Context) -> web.StreamResponse:
    number, upload_id = _part_number(ctx), _upload_id(ctx)
    payload = ctx.payload()
    if payload.length is None:
        raise S3Error("MissingContentLength", "an UploadPart needs its Content-Length")
    if payload.length > MAX_PART:
        raise S3Error("EntityTooLarge", f"a part is at most {MAX_PART} bytes",
                      resource=f"/{ctx.bucket}/{ctx.key}")
    try:
        part = await MultipartUploads(ctx.client).write_part(
            upload_id, number, payload.stream(), payload.length, md5_of=lambda: payload.md5)
    except StagerError as exc:
        raise s3_error(exc, ctx) from None
    headers = {"ETag": f'"{part.md5}"'}
    for alg, value in payload.checksums.items():
        headers[f"x-amz-checksum-{alg}"] = value
    return web.Response(headers=headers)


def _copy_range(ctx: S3Context, size: int) -> tuple[int, int]:
    """``x-amz-copy-source-range`` (``bytes=FIRST-LAST``, both inside the source) as
    ``[start, stop)``; the whole source without one."""
    text = ctx.headers.get("x-amz-copy-source-range")
    if text is None:
        return 0, size
    first, dash, last = text.removeprefix("bytes=").partition("-")
    if not (text.startswith("bytes=") and dash and _ascii_digits(first) and _ascii_digits(last)):
        raise S3Error("InvalidArgument", "x-amz-copy-source-range is bytes=FIRST-LAST")
    start, stop = int(first), int(last) + 1
    if start >= stop or stop > size:
        raise S3Error("InvalidRange", f"the range {text} is not within the source's "
                      f"{size} bytes", resource=f"/{ctx.bucket}/{ctx.key}")
    return start, stop


async def upload_part_copy(ctx: S3Context) -> web.StreamResponse:
    number, upload_id = _part_number(ctx), _upload_id(ctx)
    src_bucket, src_key = copy_source(ctx)
    info, attrs = await find(ctx, src_bucket, src_key)
    check_conditions(ctx.headers, info, attrs, prefix="x-amz-copy-source-")
    if info.is_dir:
        raise S3Error("InvalidRequest", "a directory (a key ending in /) is not copied")
    start, stop = _copy_range(ctx, info.size)
    if stop - start > MAX_PART:
        raise S3Error("EntityTooLarge", f"a part is at most {MAX_PART} bytes: give "
                      "x-amz-copy-source-range", resource=f"/{ctx.bucket}/{ctx.key}")
    try:
        part = await MultipartUploads(ctx.client).copy_part(upload_id, number, info.path,
                                                            start, stop)
    except StagerError as exc:
        raise s3_error(exc, ctx) from None
    return xml_response(document("CopyPartResult", [("LastModified", iso(part.written)),
                                                    ("ETag", f'"{part.md5}"')]))


def parse_complete(body: bytes) -> list[tuple[int, str]]:
    """CompleteMultipartUpload's body: (part number, ETag) in the order sent."""
    root = parse(body, "CompleteMultipartUpload")
    parts = []
    for elem in children(root, "Part"):
        number, etag = text_of(elem, "PartNumber"), text_of(elem, "ETag")
        if number is None or etag is None or not _ascii_digits(number.strip()):
            raise S3Error("MalformedXML", "each Part needs a PartNumber and an ETag")
        if not 1 <= int(number) <= MAX_PART_NUMBER:
            raise S3Error("InvalidArgument", f"Part number must be an integer between 1 "
                          f"and {MAX_PART_NUMBER}, inclusive")
        parts.append((int(number), etag.strip()))
    if not parts:
        raise S3Error("MalformedXML", "the XML names no Part")
    if len(parts) > MAX_PART_NUMBER:
        raise S3Error("MalformedXML", f"more than {MAX_PART_NUMBER} parts")
    return parts


async def _read_body(ctx: S3Context, limit: int) -> bytes:
    if ctx.request.content_length is not None and ctx.request.content_length > limit:
        raise S3Error("MalformedXML", "the XML body is too large")
    # read(n) returns what has arrived (at most n), not n bytes: read to the end (a
    # body of a few hundred KB came in pieces and was answered MalformedXML, cut short)
    body = bytearray()
    while len(body) <= limit and (piece := await ctx.request.content.read(limit + 1 - len(body))):
        body += piece
    if len(body) > limit:
        raise S3Error("MalformedXML", "the XML body is too large")
    return bytes(body)


def _requested_etag(requested: Sequence[tuple[int, str]]) -> str | None:
    """The multipart ETag the completion of ``requested`` makes (None: an ETag that is
    no MD5, which no part of ours has)."""
    try:
        md5s = [bytes.fromhex(etag.strip('"')) for _, etag in requested]
    except ValueError:
        return None
    digest = hashlib.md5(b"".join(md5s), usedforsecurity=False).hexdigest()
    return f'"{digest}-{len(md5s)}"'


async def _completed_before(ctx: S3Context, requested: Sequence[tuple[int, str]]
                            ) -> web.StreamResponse | None:
    """A completion sent again after it went through (its answer was lost): the object
    is there with the ETag this part list makes; the same answer again."""
    etag = _requested_etag(requested)
    try:
        _, attrs = await find(ctx, ctx.bucket, ctx.key)
    except S3Error:
        return None
    if etag is None or attrs.etag != etag or attrs.parts != len(requested):
        return None
    return _completed(ctx, etag)


def _completed(ctx: S3Context, etag: str) -> web.StreamResponse:
    return xml_response(document("CompleteMultipartUploadResult", [
        ("Location", f"{ctx.request.scheme}://{ctx.request.host}/{ctx.bucket}/{ctx.key}"),
        ("Bucket", ctx.bucket), ("Key", ctx.key), ("ETag", etag)]))


async def complete_upload(ctx: S3Context) -> web.StreamResponse:
    upload_id = _upload_id(ctx)
    requested = parse_complete(await _read_body(ctx, MAX_COMPLETE_BODY))
    try:
        listed = await _parts_of(ctx, upload_id)
    except S3Error as exc:
        again = await _completed_before(ctx, requested) if exc.code == "NoSuchUpload" \
            else None
        if again is None:
            raise
        return again
    try:
        done = await MultipartUploads(ctx.client).complete(
            upload_id, requested, _final_attrs(listed, requested))
    except StagerError as exc:
        raise s3_error(exc, ctx) from None
    return _completed(ctx, f'"{done.etag}"')


def _final_attrs(listed: PartList, requested: Sequence[tuple[int, str]]) -> dict[str, Any]:
    """The attributes the completion of ``requested`` commits its file with: those the
    upload declared, the multipart ETag and the part sizes (as the server will check
    them: a part named with another md5 than its own fails the completion)."""
    etag = _requested_etag(requested)
    if etag is None:
        return {}           # refused by the server (InvalidPart): no file to describe
    try:
        declared = ObjectAttrs.from_json(json.loads(listed.upload.extra))
    except (ValueError, KeyError, TypeError):
        declared = ObjectAttrs(etag="")
    sizes = {p.number: p.size for p in listed.parts}
    part_sizes = tuple(sizes.get(n, 0) for n, _ in requested)
    return replace(declared, etag=etag, checksums={}, parts=len(requested),
                   part_sizes=part_sizes).stored()


async def abort_upload(ctx: S3Context) -> web.StreamResponse:
    upload_id = _upload_id(ctx)
    await _parts_of(ctx, upload_id)
    try:
        await MultipartUploads(ctx.client).abort(upload_id)
    except StagerError as exc:
        raise s3_error(exc, ctx) from None
    return web.Response(status=204)


def _count(ctx: S3Context, name: str, default: int, most: int) -> int:
    text = ctx.query.get(name)
    if text is None:
        return default
    if not _ascii_digits(text):
        raise S3Error("InvalidArgument", f"{name} must be a whole number")
    return min(int(text), most)


def _owner() -> list[tuple[str, str]]:
    return [("ID", "stager"), ("DisplayName", "stager")]


async def list_parts(ctx: S3Context) -> web.StreamResponse:
    upload_id = _upload_id(ctx)
    marker = _count(ctx, "part-number-marker", 0, MAX_PART_NUMBER)
    most = _count(ctx, "max-parts", MAX_LISTED, MAX_LISTED)
    listed = await _parts_of(ctx, upload_id)
    after = [p for p in listed.parts if p.number > marker]
    shown, truncated = after[:most], len(after) > most
    return xml_response(document("ListPartsResult", [
        ("Bucket", ctx.bucket), ("Key", ctx.key), ("UploadId", upload_id),
        ("Initiator", _owner()), ("Owner", _owner()), ("StorageClass", "STANDARD"),
        ("PartNumberMarker", marker),
        ("NextPartNumberMarker", shown[-1].number if shown else marker),
        ("MaxParts", most), ("IsTruncated", truncated),
        *[("Part", [("PartNumber", p.number), ("LastModified", iso(p.written)),
                    ("ETag", f'"{p.md5}"'), ("Size", p.size)]) for p in shown]]))


def _grouped(uploads: Sequence[tuple[str, MultipartUpload]], prefix: str, delimiter: str
             ) -> tuple[list[tuple[str, MultipartUpload]], list[str]]:
    """The uploads, and the common prefixes that ``delimiter`` folds keys into."""
    if not delimiter:
        return list(uploads), []
    shown, folded = [], []
    for key, upload in uploads:
        cut = key.find(delimiter, len(prefix))
        if cut < 0:
            shown.append((key, upload))
        elif key[:cut + len(delimiter)] not in folded:
            folded.append(key[:cut + len(delimiter)])
    return shown, folded


async def list_uploads(ctx: S3Context) -> web.StreamResponse:
    await bucket_info(ctx.client, ctx.bucket)
    prefix, delimiter = ctx.query.get("prefix", ""), ctx.query.get("delimiter", "")
    key_marker = ctx.query.get("key-marker", "")
    id_marker = ctx.query.get("upload-id-marker", "") if key_marker else ""
    most = _count(ctx, "max-uploads", MAX_LISTED, MAX_LISTED)
    base = f"/{ctx.bucket}/"
    after = (base + key_marker, id_marker or ("~" if key_marker else "")) if key_marker \
        else ("", "")
    try:
        got = await MultipartUploads(ctx.client).uploads(base + prefix, after=after,
                                                         limit=most + 1)
    except StagerError as exc:
        raise s3_error(exc, ctx) from None
    page = [(key_of(ctx.bucket, u.path), u) for u in got.uploads[:most]]
    truncated = len(got.uploads) > most
    shown, folded = _grouped(page, prefix, delimiter)
    last_key, last_id = (page[-1][0], page[-1][1].upload_id) if page else ("", "")
    return xml_response(document("ListMultipartUploadsResult", [
        ("Bucket", ctx.bucket), ("KeyMarker", key_marker), ("UploadIdMarker", id_marker),
        ("NextKeyMarker", last_key if truncated else ""),
        ("NextUploadIdMarker", last_id if truncated else ""),
        ("Prefix", prefix), ("Delimiter", delimiter) if delimiter else None,
        ("MaxUploads", most), ("IsTruncated", truncated),
        *[("Upload", [("Key", key), ("UploadId", u.upload_id), ("Initiator", _owner()),
                      ("Owner", _owner()), ("StorageClass", "STANDARD"),
                      ("Initiated", iso(u.created))]) for key, u in shown],
        *[("CommonPrefixes", [("Prefix", p)]) for p in folded]]))
