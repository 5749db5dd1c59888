"""Staging: copy a dataset from any fsspec URL into stager, or results back out.

::

    report = await stage(aclient, "s3://bucket/ds", "/datasets/ds", include=["*.tar"])
    report = stage_sync(client, "stager:///runs/7", "s3://bucket/runs/7")   # a blocking Client

``stage(client, SRC, DST)`` decides the direction from the URLs: a ``DST``
without a protocol, or a ``stager://`` one, is a stager path (stage-in from
``SRC``, any fsspec URL, a bare path being local); otherwise ``SRC`` must be a
``stager://`` URL (stage-out to ``DST``, any fsspec URL).  Staging is built on
the client, not part of it: the client never imports this package.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fsspec.asyn import sync
from fsspec.core import split_protocol

from ..errors import BadRequest
from ..protocol import paths
from .out import stage_out
from .run import StageOptions, StageReport, stage_in

if TYPE_CHECKING:
    from ..client import AsyncClient, Client

__all__ = ["StageOptions", "StageReport", "stage", "stage_sync", "stager_url"]


def stager_url(url: str, *, bare_is_stager: bool) -> tuple[str | None, str] | None:
    """``(meta_url or None, path)`` when ``url`` names a stager path, else ``None``."""
    protocol, rest = split_protocol(url)
    if protocol is None:
        return (None, _keep_slash(url, url)) if bare_is_stager else None
    if protocol != "stager":
        return None
    netloc, _, path = rest.partition("/")
    return (f"http://{netloc}" if netloc else None), _keep_slash(url, "/" + path)


def _keep_slash(url: str, path: str) -> str:
    """The canonical path, with the trailing ``/`` that means "into this directory"."""
    canonical = paths.normalize(path)
    return canonical + "/" if url.endswith("/") and canonical != "/" else canonical


async def stage(client: AsyncClient, src: str, dst: str, options: StageOptions | None = None,
                **fields: Any) -> StageReport:
    """Copy a dataset from any fsspec URL ``src`` into the stager path ``dst`` (or a
    ``stager://`` path out to any URL), in parallel and resumably.  ``fields`` are
    :class:`StageOptions` fields, over ``options``."""
    options = replace(options or StageOptions(), **fields)
    if options.layout is not None:
        options.layout.validate()
    into = stager_url(dst, bare_is_stager=True)
    if into is not None:
        _same_cluster(client, into[0], dst)
        return await stage_in(client, src, into[1], options)
    out_of = stager_url(src, bare_is_stager=False)
    if out_of is not None:
        _same_cluster(client, out_of[0], src)
        return await stage_out(client, out_of[1], dst, options)
    raise BadRequest(f"nothing to stage between {src!r} and {dst!r}: the destination must be "
                     "a stager path (stage-in) or the source a stager:// URL (stage-out)")


def stage_sync(client: Client, src: str, dst: str, options: StageOptions | None = None,
               **fields: Any) -> StageReport:
    """:func:`stage` for a blocking :class:`~stager.Client`, on its I/O thread."""
    return sync(client.loop, stage, client.aio, src, dst, options, **fields)


def _same_cluster(client: AsyncClient, meta_url: str | None, url: str) -> None:
    if meta_url is not None and meta_url.rstrip("/") != client.meta_url.rstrip("/"):
        raise BadRequest(f"{url} names the cluster at {meta_url}, but this client talks to "
                         f"{client.meta_url}")
