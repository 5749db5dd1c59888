"""Staging: copy a dataset from any fsspec URL into stager, or results back out.

``stage(client, SRC, DST)`` decides the direction from the URLs: a ``DST``
without a protocol, or a ``stager://`` one, is a stager path (stage-in from
``SRC``, any fsspec URL, a bare path being local); otherwise ``SRC`` must be a
``stager://`` URL (stage-out to ``DST``, any fsspec URL).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsspec.core import split_protocol

from ..errors import BadRequest
from ..protocol import paths
from .out import stage_out
from .run import StageOptions, StageReport, stage_in

if TYPE_CHECKING:
    from ..client import AsyncClient

__all__ = ["StageOptions", "StageReport", "stage", "stager_url"]


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


async def stage(client: AsyncClient, src: str, dst: str,
                options: StageOptions | None = None) -> StageReport:
    options = options or StageOptions()
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


def _same_cluster(client: AsyncClient, meta_url: str | None, url: str) -> None:
    if meta_url is not None and meta_url.rstrip("/") != client.meta_url.rstrip("/"):
        raise BadRequest(f"{url} names the cluster at {meta_url}, but this client talks to "
                         f"{client.meta_url}")
