"""Buckets: the top-level directories of the namespace.

ListBuckets shows every top-level directory the principal may list (a file at the
top level is no bucket; ``.s3``, the gateway's own, is hidden).  CreateBucket makes
the directory (``BucketAlreadyOwnedByYou`` when it exists: one owner, the
cluster); DeleteBucket removes it only when it holds no object
(``BucketNotEmpty``) — empty directories left in it go with it.
"""

from __future__ import annotations

from aiohttp import web

from ..client import AsyncClient
from ..errors import DirectoryNotEmpty, NotFound
from ..protocol.models import FileInfo
from . import xml
from .attrs import drop_old_records
from .context import S3Context
from .errors import S3Error
from .names import HIDDEN, bucket_path, check_new_bucket

OWNER = (("ID", "stager"), ("DisplayName", "stager"))
REGION = "us-east-1"


def xml_response(body: bytes, status: int = 200) -> web.Response:
    return web.Response(status=status, body=body, headers={"Content-Type": "application/xml"})


async def bucket_info(client: AsyncClient, bucket: str) -> FileInfo:
    """The bucket's directory; ``NoSuchBucket`` when there is none."""
    try:
        info = await client.stat(bucket_path(bucket), cached=False)
    except NotFound:
        info = None
    if info is None or not info.is_dir:
        raise S3Error("NoSuchBucket", "the bucket does not exist", resource=f"/{bucket}")
    return info


async def list_buckets(ctx: S3Context) -> web.StreamResponse:
    found = [e for e in await ctx.client.ls("/")
             if e.is_dir and not e.name.startswith(".") and e.name != HIDDEN]
    body = xml.document("ListAllMyBucketsResult", [
        ("Owner", OWNER),
        ("Buckets", [("Bucket", (("Name", e.name), ("CreationDate", xml.iso(e.mtime))))
                     for e in sorted(found, key=lambda e: e.name)]),
    ])
    return xml_response(body)


async def create_bucket(ctx: S3Context) -> web.StreamResponse:
    check_new_bucket(ctx.bucket)
    body = await ctx.request.read()
    if body.strip():
        xml.parse(body, "CreateBucketConfiguration")     # a region: any is ours
    try:
        info = await ctx.client.stat(bucket_path(ctx.bucket), cached=False)
    except NotFound:
        info = None
    if info is not None:
        code = "BucketAlreadyOwnedByYou" if info.is_dir else "InvalidBucketName"
        raise S3Error(code, "the bucket already exists" if info.is_dir
                      else "a file of that name is at the top level", resource=f"/{ctx.bucket}")
    await ctx.client.mkdir(bucket_path(ctx.bucket), parents=False, exist_ok=True)
    return web.Response(headers={"Location": f"/{ctx.bucket}"})


async def head_bucket(ctx: S3Context) -> web.StreamResponse:
    await bucket_info(ctx.client, ctx.bucket)
    return web.Response(headers={"x-amz-bucket-region": REGION})


async def get_location(ctx: S3Context) -> web.StreamResponse:
    await bucket_info(ctx.client, ctx.bucket)
    # us-east-1 is S3's empty LocationConstraint
    return xml_response(xml.document("LocationConstraint", []))


async def delete_bucket(ctx: S3Context) -> web.StreamResponse:
    await bucket_info(ctx.client, ctx.bucket)
    await _remove_empty(ctx.client, bucket_path(ctx.bucket))
    await drop_old_records(ctx.client, ctx.bucket)
    return web.Response(status=204)


async def _remove_empty(client: AsyncClient, path: str) -> None:
    """Remove directory ``path`` and the empty directories below it, deepest first,
    each without ``recursive``: a file (one written meanwhile too) is never removed,
    its directory stays, and the answer is ``BucketNotEmpty``."""
    subdirs = [e.path async for e in client.iter_dir(path) if e.is_dir]
    for sub in subdirs:
        await _remove_empty(client, sub)
    try:
        await client.rm(path, recursive=False)
    except DirectoryNotEmpty:
        raise S3Error("BucketNotEmpty", "the bucket you tried to delete is not empty",
                      resource=path) from None
    except NotFound:
        pass
