"""Staging opens any fsspec URL as a source (:mod:`stager.sources.source`).

:func:`open_source` gives an async filesystem (http, s3, gcs, stager) its own
instance on the running loop, awaited directly; a blocking one (local, memory,
…) runs in a thread pool.  :func:`filesystem_class` names an unknown protocol
or a missing package as a clear error.
"""

from __future__ import annotations

import asyncio
from typing import Any

import fsspec
from fsspec.core import split_protocol, url_to_fs
from fsspec.implementations.http import HTTPFileSystem

from ..errors import BadRequest
from .source import AsyncSource, Source, ThreadSource


def filesystem_class(url: str) -> type[fsspec.AbstractFileSystem]:
    """The fsspec class for ``url``'s protocol, or a clear error naming the cause."""
    protocol = split_protocol(url)[0] or "file"
    try:
        return fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise BadRequest(f"unknown protocol {protocol!r} in {url!r}: not an fsspec protocol "
                         f"({len(fsspec.available_protocols())} are known, e.g. file, http, "
                         "memory, s3, gs)", url=url) from None
    except ImportError as exc:
        raise BadRequest(f"protocol {protocol!r} of {url!r} needs a package that is not "
                         f"installed: {exc}", url=url) from None


async def open_source_off_loop(url: str, **storage_options: Any) -> Source:
    """:func:`open_source` for a server's event loop: what opening loads from disk is
    loaded on a thread — the protocol's package (s3fs and botocore: a quarter of a
    second idle), and for ``s3://`` botocore's service models, which its first client
    would otherwise parse on the loop (two seconds under load)."""
    cls = await asyncio.to_thread(filesystem_class, url)
    if "s3" in _protocols(cls) and "session" not in storage_options:
        storage_options = {**storage_options,
                           "session": await asyncio.to_thread(_botocore_session)}
    return open_source(url, **storage_options)


def _protocols(cls: type[fsspec.AbstractFileSystem]) -> tuple[str, ...]:
    protocol = cls.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _botocore_session() -> Any:
    """An aiobotocore session whose data loader has S3's models loaded: a blocking
    client made once from the same loader reads them into its caches."""
    import botocore.session
    from aiobotocore.session import AioSession

    warm = botocore.session.get_session()
    warm.create_client("s3", region_name="us-east-1", aws_access_key_id="-",
                       aws_secret_access_key="-").close()
    session = AioSession()
    session.register_component("data_loader", warm.get_component("data_loader"))
    return session


def open_source(url: str, **storage_options: Any) -> Source:
    cls = filesystem_class(url)
    if "::" not in url and getattr(cls, "async_impl", False):
        loop = asyncio.get_running_loop()
        fs = cls(asynchronous=True, loop=loop, skip_instance_cache=True,
                 **{**cls._get_kwargs_from_urls(url), **storage_options})
        # Raw ranged reads only where no setting of fsspec's (headers, auth,
        # client options) has to be honoured.
        raw = isinstance(fs, HTTPFileSystem) and not storage_options
        return AsyncSource(url, fs, cls._strip_protocol(url), raw_http=raw)
    fs, path = url_to_fs(url, **storage_options)
    return ThreadSource(url, fs, path)
