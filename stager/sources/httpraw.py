"""Plain-``http://`` sources read without fsspec's per-request overhead.

fsspec's HTTP filesystem costs two requests per file to stage it (a ``HEAD`` for
the size its directory pages lack, then a ``GET``) and reads each body the way
aiohttp does: a new ``bytes`` per socket read, joined at the end.  Here
:mod:`stager.dataplane.rawhttp` has the kernel write bodies where they belong,
and :meth:`RawHttp.probe` learns a file's size, ``ETag`` and ``Last-Modified``
from one ranged ``GET`` (``Range: bytes=0-N``) whose body, for a file of up to
``N + 1`` bytes, is the whole file: listing and reading a small file is one
request.

Only answers that are exactly what was asked (a 206 with its ``Content-Range``,
or a 200 that fits, no content coding) are taken.  For anything else (https,
credentials in the URL, a redirect, an error status, a server that ignores
ranges with a body too large to take, an empty file's 416) the methods return
``None`` and the caller asks again through fsspec, which reports errors as it
always did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yarl

from ..dataplane import rawhttp
from ..protocol.ranges import parse_content_range

RAW_CONNECTIONS = 64   # raw reads of an http source in flight, per server
RAW_TIMEOUT = 60.0     # seconds of silence (connecting included) before a raw read fails


@dataclass(frozen=True)
class Probed:
    """What one probe learnt: fsspec-style info (``size``, ``ETag``, ``Last-Modified``)
    and, when the whole file fit in the probe, its bytes."""

    info: dict[str, Any]
    body: bytes | None


@dataclass(frozen=True)
class Got:
    """A ranged read that filled its buffer: the file's total size and its ETag."""

    total: int | None
    etag: str | None


class RawHttp:
    """Raw GETs of one plain-``http://`` fsspec filesystem's URLs."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs
        self.pool = rawhttp.RawPool(limit=RAW_CONNECTIONS, connect_timeout=RAW_TIMEOUT,
                                    read_timeout=RAW_TIMEOUT)
        # Probe buffers, reused: a fresh one of this size would cost an mmap and a
        # page fault per page for every file.
        self._spare: dict[int, list[bytearray]] = {}

    def _target(self, path: str) -> tuple[str, str] | None:
        """``(origin, path and query)`` as fsspec would send them, or ``None`` where
        fsspec must: anything but plain http without credentials."""
        encode = getattr(self.fs, "encode_url", yarl.URL)
        url = encode(path)
        if url.scheme != "http" or not url.host or url.user is not None:
            return None
        return f"http://{url.raw_authority}", url.raw_path_qs

    async def _get(self, path: str, start: int, out: memoryview, exact: bool,
                   if_none_match: str | None = None) -> rawhttp.RawResponse | None:
        target = self._target(path)
        if target is None or not len(out):
            return None
        hdrs = {"Range": f"bytes={start}-{start + len(out) - 1}",
                "Accept-Encoding": "identity"}
        if if_none_match is not None:
            hdrs["If-None-Match"] = if_none_match
        try:
            resp = await self.pool.request(target[0], "GET", target[1], hdrs, None, out,
                                           exact=exact)
        except (rawhttp.Unsupported, rawhttp.LengthMismatch):
            return None
        if resp.headers.get("content-encoding", "identity") != "identity":
            return None
        return resp

    async def read_into(self, path: str, start: int, out: memoryview) -> Got | None:
        """``out`` filled from byte ``start`` by one ranged GET; ``None`` unless the
        answer is exactly that range (a 206 with its ``Content-Range``)."""
        resp = await self._get(path, start, out, exact=True)
        if resp is None or resp.status != 206:
            return None
        first, last, total = parse_content_range(resp.headers.get("content-range", ""))
        if (first, last) != (start, start + len(out) - 1):
            return None
        return Got(total, resp.headers.get("etag"))

    async def probe(self, path: str, limit: int,
                    unless: tuple[int, str] | None = None) -> Probed | None:
        """The file's size, ETag and Last-Modified from a GET of its first ``limit``
        bytes, and its bytes when it has no more than that.

        ``unless=(size, etag)``: what an earlier probe found (a strong ETag).  The
        GET is conditional (``If-None-Match``), and a server that finds the ETag
        unchanged answers 304, without reading the file: the file is as before.
        """
        spare = self._spare.setdefault(limit, [])
        buf = spare.pop() if spare else bytearray(limit)
        resp = await self._get(path, 0, memoryview(buf), exact=False,
                               if_none_match=unless[1] if unless else None)
        # Reused only after an answer: a cancelled or failed read's connection is
        # closed, but nothing else is certain about its buffer.
        try:
            return self._probed(path, limit, buf, resp, unless)
        finally:
            if len(spare) < RAW_CONNECTIONS:
                spare.append(buf)

    @staticmethod
    def _probed(path: str, limit: int, buf: bytearray, resp: rawhttp.RawResponse | None,
                unless: tuple[int, str] | None) -> Probed | None:
        if resp is None:
            return None
        if resp.status == 304 and unless is not None:
            info = {"name": path, "size": unless[0], "type": "file", "ETag": unless[1]}
            return Probed(_validators(info, resp.headers), None)
        if resp.status == 206:
            first, last, total = parse_content_range(resp.headers.get("content-range", ""))
            if first != 0 or total is None or last != min(limit, total) - 1:
                return None
        elif resp.status == 200:
            total = resp.length             # ranges ignored: the whole file, and it fit
        else:
            return None
        info = _validators({"name": path, "size": total, "type": "file"}, resp.headers)
        whole = total == resp.length
        return Probed(info, bytes(memoryview(buf)[:total]) if whole else None)

    def close(self) -> None:
        self.pool.close()


def _validators(info: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """``info`` with the answer's ``ETag`` and ``Last-Modified``, named as fsspec does."""
    for name in ("ETag", "Last-Modified"):
        value = headers.get(name.lower())
        if value:
            info[name] = value
    return info

