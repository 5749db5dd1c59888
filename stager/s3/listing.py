"""ListObjectsV2 and ListObjects (v1) over the bucket's directory tree.

S3 lists keys in the byte order of their UTF-8 (the code point order of Python's
``str``), and stager lists one directory at a time.  A directory is walked with
its entries sorted as their keys sort (a directory ``a`` as ``a/``, so ``a.txt``
comes before everything in ``a``), depth first, and a subtree wholly before the
continuation point or outside the prefix is never read.

With the delimiter ``/`` a directory below the prefix is one CommonPrefix and is
not read at all.  Any other delimiter groups keys of the full walk, as S3 does.
Without a delimiter a directory with no entry is listed as its "folder" key
(``a/b/``, size 0; see :mod:`.objects`); a directory holding keys is not a key.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import quote

from aiohttp import web

from ..client import AsyncClient
from ..errors import InvalidPath, NotADirectory, NotFound
from ..protocol.models import FileInfo
from . import xml
from .attrs import attrs_of
from .buckets import OWNER, bucket_info, xml_response
from .context import S3Context
from .errors import S3Error
from .names import bucket_path
from .objects import EMPTY_ETAG

MAX_KEYS = 1000


@dataclass(frozen=True)
class Item:
    key: str
    info: FileInfo | None        # None: a CommonPrefix
    folder: bool = False         # an empty directory listed as its "folder" key


@dataclass(frozen=True)
class After:
    """Where a listing continues: after ``key``, and past every key below it when it
    was a CommonPrefix."""

    key: str = ""
    was_prefix: bool = False

    def passes(self, key: str) -> bool:
        return key > self.key and not (self.was_prefix and key.startswith(self.key))

    def token(self) -> str:
        raw = ("p:" if self.was_prefix else "k:") + self.key
        return base64.urlsafe_b64encode(raw.encode("utf-8", "surrogatepass")).decode()

    @classmethod
    def from_token(cls, token: str) -> After:
        try:
            raw = base64.urlsafe_b64decode(token.encode()).decode("utf-8", "surrogatepass")
        except (binascii.Error, ValueError):
            raw = ""
        if raw[:2] not in ("p:", "k:"):
            raise S3Error("InvalidArgument", "The continuation token provided is incorrect")
        return cls(raw[2:], raw[:2] == "p:")


def _sort_key(entry: FileInfo) -> str:
    return entry.name + ("/" if entry.is_dir else "")


def _start_name(rel: str, after: After) -> str:
    """A name to list directory ``rel`` after (the list route's exclusive cursor) that
    skips no entry at or beyond the continuation point: the first segment of the
    point below ``rel``, cut before its first character below ``/`` (a directory
    ``a`` sorts as ``a/``, after ``a.txt``) and by one more (the cursor is exclusive)."""
    if not after.key.startswith(rel):
        return ""
    first = after.key[len(rel):].split("/", 1)[0]
    cut = next((i for i, ch in enumerate(first) if ch < "/"), len(first))
    return first[:max(0, cut - 1)]


async def _in_key_order(entries: AsyncIterator[FileInfo]) -> AsyncIterator[FileInfo]:
    """A directory's entries (which come in name order) in key order, streaming: a
    directory ``a`` is held back while names ``a`` + a character below ``/`` follow
    (``a.txt``, ``a-b``), which sort before ``a/``.  What is held is one chain of such
    names, never the directory."""
    held: list[FileInfo] = []          # directories waiting, in key order
    async for entry in entries:
        key = _sort_key(entry)
        while held and _sort_key(held[0]) < key:
            yield held.pop(0)
        if entry.is_dir:
            held.append(entry)
            held.sort(key=_sort_key)
        else:
            yield entry
    for entry in held:
        yield entry


async def _walk(client: AsyncClient, bucket: str, rel: str, prefix: str, after: After,
                slash: bool) -> AsyncIterator[Item]:
    """The items of directory ``rel`` (a key prefix: ``""`` or ``"a/b/"``) in order."""
    listed = client.iter_dir(bucket_path(bucket) + "/" + rel,
                             after=_start_name(rel, after))
    empty = True
    try:
        async for entry in _in_key_order(listed):
            empty = False
            key = rel + _sort_key(entry)
            if not entry.is_dir:
                if key.startswith(prefix) and after.passes(key):
                    yield Item(key, entry)
                continue
            if not (key.startswith(prefix) or prefix.startswith(key)):
                continue
            if slash and key.startswith(prefix):
                if after.passes(key) and not after.key.startswith(key):
                    yield Item(key, None)
                continue
            if after.key >= key and not after.key.startswith(key):
                continue            # the whole subtree is before the continuation point
            async for item in _walk(client, bucket, key, prefix, after, slash):
                yield item
    except (NotFound, NotADirectory, InvalidPath):
        return          # no such directory (or a prefix no path can have): no key
    finally:
        await listed.aclose()  # type: ignore[attr-defined]
    if empty and rel and rel.startswith(prefix) and after.passes(rel) \
            and not _start_name(rel, after):
        yield Item(rel, None, folder=True)


async def _grouped(items: AsyncIterator[Item], prefix: str, delimiter: str,
                   after: After) -> AsyncIterator[Item]:
    """S3's grouping of keys into CommonPrefixes by ``delimiter``."""
    last = ""
    async for item in items:
        rest = item.key[len(prefix):]
        at = rest.find(delimiter) if delimiter else -1
        if at < 0 or item.info is None and not item.folder and delimiter == "/":
            yield item
            continue
        common = prefix + rest[:at + len(delimiter)]
        if common != last and after.passes(common) and not after.key.startswith(common):
            last = common
            yield Item(common, None)


@dataclass
class Page:
    contents: list[Item]
    prefixes: list[str]
    truncated: bool
    last: After | None


async def page(client: AsyncClient, bucket: str, prefix: str, delimiter: str,
               after: After, max_keys: int) -> Page:
    slash = delimiter == "/"
    start = prefix[:prefix.rfind("/") + 1]
    items = _grouped(_walk(client, bucket, start, prefix, after, slash), prefix, delimiter,
                     after)
    contents: list[Item] = []
    prefixes: list[str] = []
    last: After | None = None
    truncated = False
    try:
        async for item in items:
            if len(contents) + len(prefixes) >= max_keys:
                truncated = True
                break
            if item.info is None and not item.folder:
                prefixes.append(item.key)
                last = After(item.key, True)
            else:
                contents.append(item)
                last = After(item.key, False)
    finally:
        await items.aclose()  # type: ignore[attr-defined]
    return Page(contents, prefixes, truncated, last)


def _max_keys(ctx: S3Context) -> int:
    text = ctx.query.get("max-keys", str(MAX_KEYS))
    if not (text.isascii() and text.isdigit()):
        raise S3Error("InvalidArgument", "max-keys is a non-negative integer")
    return min(int(text), MAX_KEYS)


def _etag(item: Item) -> str:
    """An entry's ETag, from the attributes its listing entry carries (no round trip)."""
    return EMPTY_ETAG if item.folder or item.info is None else attrs_of(item.info).etag


@dataclass(frozen=True)
class Request:
    """A ListObjects(V2) request's parameters, checked."""

    v2: bool
    prefix: str
    delimiter: str
    after: After
    max_keys: int
    encode: bool            # encoding-type=url

    @classmethod
    def of(cls, ctx: S3Context) -> Request:
        q = ctx.query
        encode = q.get("encoding-type") == "url"
        if "encoding-type" in q and not encode:
            raise S3Error("InvalidArgument", "encoding-type is url")
        for name in ("prefix", "delimiter", "start-after", "marker"):
            if any(ord(ch) < 0x20 and ch not in "\t\n\r" for ch in q.get(name, "")):
                # no key holds one, and XML 1.0 cannot carry it back
                raise S3Error("InvalidArgument", f"{name} has a control character")
        v2 = q.get("list-type") == "2"
        if not v2:
            after = After(q.get("marker", ""))
        elif "continuation-token" in q:
            after = After.from_token(q["continuation-token"])
        else:
            after = After(q.get("start-after", ""))
        return cls(v2, q.get("prefix", ""), q.get("delimiter", ""), after, _max_keys(ctx),
                   encode)

    def text(self, value: str) -> str:
        return quote(value, safe="/") if self.encode else value


async def list_objects(ctx: S3Context) -> web.StreamResponse:
    await bucket_info(ctx.client, ctx.bucket)
    req = Request.of(ctx)
    got = await page(ctx.client, ctx.bucket, req.prefix, req.delimiter, req.after,
                     req.max_keys) if req.max_keys else Page([], [], False, None)
    owner = not req.v2 or ctx.query.get("fetch-owner") == "true"
    contents = [("Contents", (
        ("Key", req.text(item.key)),
        ("LastModified", xml.iso(item.info.mtime if item.info else 0.0)),
        ("ETag", _etag(item)),
        ("Size", item.info.size if item.info and not item.folder else 0),
        ("Owner", OWNER) if owner else None,
        ("StorageClass", "STANDARD"),
    )) for item in got.contents]
    common = [("CommonPrefixes", (("Prefix", req.text(p)),)) for p in got.prefixes]
    head = _head(ctx, req, got, len(contents) + len(common))
    return xml_response(xml.document("ListBucketResult", [*head, *contents, *common]))


def _head(ctx: S3Context, req: Request, got: Page, count: int) -> list[xml.Node]:
    """The ListBucketResult's elements before its Contents."""
    q = ctx.query
    head: list[xml.Node] = [("Name", ctx.bucket), ("Prefix", req.text(req.prefix))]
    if req.v2:
        head += [("KeyCount", count), ("MaxKeys", req.max_keys)]
        if "continuation-token" in q:
            head.append(("ContinuationToken", q["continuation-token"]))
        if "start-after" in q:
            head.append(("StartAfter", req.text(q["start-after"])))
        if got.truncated and got.last is not None:
            head.append(("NextContinuationToken", got.last.token()))
    else:
        head += [("Marker", req.text(req.after.key)), ("MaxKeys", req.max_keys)]
        if got.truncated and got.last is not None:
            head.append(("NextMarker", req.text(got.last.key)))
    if req.delimiter:
        head.append(("Delimiter", req.text(req.delimiter)))
    if req.encode:
        head.append(("EncodingType", "url"))
    head.append(("IsTruncated", got.truncated))
    return head
