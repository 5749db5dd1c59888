"""What every S3 handler is given: the gateway's state and one request's context.

:class:`Gateway` lives as long as the app: the cluster's address, the
authenticator, and one :class:`~stager.client.AsyncClient` per stager token (an
open cluster has one, for ``None``).  :class:`S3Context` is one request: the
aiohttp request, the client to act with (the principal's token's), the bucket and
key, and the request id every answer carries.  Handlers here and in
``stager/s3/multipart.py`` take an ``S3Context`` and return a response.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from ..bounded import Bounded
from ..client import AsyncClient
from ..config import Config
from .auth import Authenticator, Principal
from .names import object_path

if TYPE_CHECKING:
    from .payload import Payload

KEPT_CLIENTS = 64       # clients (one per token) kept open
CLOSE_AFTER = 600.0     # seconds an evicted client stays open for the requests using it


class Gateway:
    """The app-wide state of one ``stager s3``."""

    def __init__(self, meta_url: str, config: Config, *, domain: str = "",
                 authenticator: Authenticator | None = None) -> None:
        self.meta_url = meta_url
        self.config = config
        self.domain = domain
        self.authenticator = authenticator or Authenticator(required=False)
        self._clients: Bounded[str | None, AsyncClient] = Bounded(KEPT_CLIENTS,
                                                                  on_evict=self._evicted)
        self._retired: set[AsyncClient] = set()     # evicted, closed after CLOSE_AFTER
        self._closing: set[asyncio.Task[None]] = set()

    def client(self, token: str | None) -> AsyncClient:
        """The client acting with ``token`` (``None``: no token, an open cluster)."""
        got = self._clients.get(token)
        if got is None:
            got = AsyncClient(self.meta_url, config=self.config, token=token)
        self._clients.put(token, got)
        return got

    def _evicted(self, _: str | None, client: AsyncClient) -> None:
        """Closed once the requests that hold it are surely done (or at close)."""
        self._retired.add(client)
        asyncio.get_running_loop().call_later(CLOSE_AFTER, self._retire, client)

    def _retire(self, client: AsyncClient) -> None:
        if client in self._retired:
            self._retired.discard(client)
            task = asyncio.ensure_future(client.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        for c in [*self._clients.values(), *self._retired]:
            await c.close()
        self._clients.clear()
        self._retired.clear()
        await asyncio.gather(*self._closing, return_exceptions=True)
        await self.authenticator.close()


@dataclass
class S3Context:
    """One S3 request.

    ``client`` acts with the principal's token, so the cluster checks every scope and
    prefix.  ``bucket`` and ``key`` are as the request named them (``""`` when
    absent); :attr:`path` is the key's stager path.  ``principal.chunks`` is set for
    a signed ``aws-chunked`` body: read bodies through :meth:`body`, which checks
    the chunk signatures, the length and every checksum the request declares.
    """

    request: web.Request
    gateway: Gateway
    principal: Principal
    client: AsyncClient
    bucket: str = ""
    key: str = ""
    request_id: str = field(default_factory=lambda: secrets.token_hex(8).upper())

    @property
    def query(self) -> web.MultiDictProxy[str]:  # type: ignore[type-arg]
        return self.request.query

    @property
    def headers(self) -> web.CIMultiDictProxy[str]:  # type: ignore[name-defined]
        return self.request.headers

    @property
    def path(self) -> str:
        return object_path(self.bucket, self.key)

    def payload(self) -> Payload:
        """The request body, decoded (``aws-chunked``) and checked as it streams:
        ``payload.stream()`` raises an ``S3Error`` (``BadDigest``, ``IncompleteBody``,
        …) at the first fault, before its end, so a write fed from it is never
        committed; afterwards ``payload.md5`` and ``payload.checksums`` hold what was
        computed (the ETag, the ``x-amz-checksum-*`` to echo)."""
        from .payload import Payload

        return Payload(self)
