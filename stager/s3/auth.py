"""Who sent an S3 request: AWS Signature V4 checked against stager's S3 keys.

The gateway calls :meth:`Authenticator.authenticate` once per request, before it reads
the body. The answer, a :class:`Principal`, carries the stager token the gateway acts
with, so every scope, prefix, expiry and revocation is the token's own and is checked
by the servers as for any client. A body sent as signed ``aws-chunked``
(``STREAMING-AWS4-HMAC-SHA256-PAYLOAD``) is checked chunk by chunk with
``Principal.chunks``.

An open cluster (``required=False``) accepts any credentials and unsigned requests, as
the rest of stager does: nothing is checked, not even the shape of an
``Authorization`` header.

**Where the secrets are, and who may do what** (least privilege):

- ``stager token create --s3`` mints a stager token and an S3 key bound to it. The
  metadata server keeps the key id, the token id, and the secret and the token's text
  sealed with a key file of its auth directory (``s3.key``): the database alone
  signs nothing, and no secret is ever sent anywhere after it was shown once.
- The gateway holds no secret and no user's token at rest.  It holds a credential of
  its own, of the scope ``s3gateway``, whose one power is the ``s3key_verify`` question:
  the auth matrix checks it is refused everywhere else (it reads, writes, lists and
  mints nothing).  ``stager up --auth --s3-port`` mints it into
  ``ROOT/auth/s3gateway.token``; a gateway run alone takes it through ``--token-file``
  (``stager token create --scope s3gateway``).
- Per request the gateway reads what the request claims (stager/s3/sigv4.py: the
  canonical request, which covers the claimed ``x-amz-content-sha256``, and the string
  to sign) and checks its time (15 min of skew; a presigned URL's expiry, at most 7
  days).  It asks the metadata server whether the signature signs that string with the
  key's secret.  The answer is the signing key of that day, region and service (an
  HMAC derived from the secret: good for nothing else) and the token's text — or
  ``InvalidAccessKeyId`` (no such key; its token revoked or expired) or
  ``SignatureDoesNotMatch``.
- The gateway remembers an answer for :data:`CACHE_TTL` seconds (30) per (key, scope):
  the next requests of that key are checked here with the signing key alone, and after
  that the metadata server is asked again, so a revoked token's key is refused within
  30 s by the gateway (and at once by the servers, which refuse the revoked token the
  gateway acts with).  Requests of one key that arrive together wait for one question;
  a key refused as unknown (or revoked) is refused without asking for
  :data:`REFUSED_TTL` seconds, so a flood of bad keys costs the metadata server little.
- A presigned URL carries a signature over one method, one path, its query and its
  signed headers: changing any of them breaks it (tests/test_s3_sigv4.py), so whoever
  holds the URL can make that request and no other, until it expires.  It still acts
  with the key's token: share URLs from a key whose token is no wider than wanted.
- A signed ``aws-chunked`` body is checked chunk by chunk against the chain that starts
  at the request's signature (:class:`~stager.s3.sigv4.ChunkChain`), with the day's
  signing key: no chunk can be changed, dropped, reordered or appended.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from ..bounded import Bounded
from ..client import AsyncClient
from ..config import Config
from ..errors import Forbidden, NotFound, Unauthenticated
from ..protocol.s3keys import S3VerifyRequest
from . import sigv4
from .errors import S3Error

log = logging.getLogger("stager.s3")
CACHE_TTL = 30.0            # seconds an answer of the metadata server is used for
CACHE_SIZE = 4096           # (key, scope) answers remembered
REFUSED_TTL = 5.0           # seconds an unknown (or revoked) key is refused without asking


class ChunkSignatures(Protocol):
    """Checks the signature chain of a signed ``aws-chunked`` body."""

    def chunk(self, payload_sha256: str, signature: str) -> None:
        """One chunk's signature (the last chunk is empty); raises ``S3Error``
        ``SignatureDoesNotMatch`` when it is not the next link of the chain."""

    def trailer(self, trailer: bytes, signature: str) -> None:
        """The trailing headers' signature (``x-amz-trailer-signature``)."""


@dataclass(frozen=True)
class Principal:
    access_key: str | None          # None: an unsigned request to an open cluster
    token: str | None               # the stager token to act with (None: open cluster)
    chunks: ChunkSignatures | None = None   # set for signed aws-chunked bodies


ANONYMOUS = Principal(access_key=None, token=None)


@dataclass(frozen=True)
class _Known:
    """What the metadata server answered for one (access key, scope)."""

    signing_key: bytes
    token: str
    expires: int                    # the token's expiry
    asked: float                    # when


class Authenticator:
    """Checks each request's signature (``required``) or lets any request in.

    ``meta_url`` and ``config`` (whose token is the gateway's own ``s3gateway``
    credential) reach the metadata server that checks signatures; needed when
    ``required``."""

    def __init__(self, *, required: bool = False, meta_url: str = "",
                 config: Config | None = None, cache_ttl: float = CACHE_TTL,
                 clock: Callable[[], float] = time.time) -> None:
        if required and not meta_url:
            raise ValueError("a gateway that checks signatures needs the metadata server")
        self.required = required
        self.meta_url = meta_url
        self.config = config
        self.cache_ttl = cache_ttl
        self.clock = clock
        self.asked = 0              # questions sent to the metadata server (tests, metrics)
        self._known: Bounded[tuple[str, str], _Known] = Bounded(CACHE_SIZE)
        # keys the metadata server said are unknown, revoked or expired: (when, why)
        self._refused: Bounded[str, tuple[float, str]] = Bounded(CACHE_SIZE)
        self._asking: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._client: AsyncClient | None = None

    async def authenticate(self, request: web.Request) -> Principal:
        if not self.required:
            return ANONYMOUS
        signed = sigv4.parse(request.method, request.raw_path, request.headers.items())
        if signed is None:
            raise S3Error("AccessDenied", "Anonymous access is not allowed here: sign "
                          "requests with a key of `stager token create --s3`")
        now = self.clock()
        sigv4.check_time(signed, now)
        known = await self._signing_key(signed, now)
        chunks = sigv4.ChunkChain(known.signing_key, signed.amz_date, signed.scope,
                                  signed.signature) if signed.signed_chunks else None
        return Principal(signed.access_key, known.token, chunks)

    async def _signing_key(self, signed: sigv4.SignedRequest, now: float) -> _Known:
        """The day's signing key of the request's key: remembered, or asked for (the
        metadata server checks the signature then); the signature checked with it.
        Requests of one key arriving together wait for one question."""
        slot = (signed.access_key, signed.scope.text)
        refused = self._refused.get(signed.access_key)
        if refused is not None and now - refused[0] <= REFUSED_TTL:
            raise S3Error("InvalidAccessKeyId", refused[1])
        asking = self._asking.get(slot)
        if asking is not None:
            await asyncio.wait([asking])            # its answer, or its failure: ask anew
        known = self._known.get(slot)
        if known is not None and now - known.asked <= self.cache_ttl and now <= known.expires:
            self._known.move_to_end(slot)
            sigv4.verify(known.signing_key, signed)
            return known
        done = self._asking[slot] = asyncio.get_running_loop().create_future()
        try:
            return await self._ask(slot, signed, now)
        finally:
            done.set_result(None)
            if self._asking.get(slot) is done:
                del self._asking[slot]

    async def _ask(self, slot: tuple[str, str], signed: sigv4.SignedRequest,
                   now: float) -> _Known:
        self.asked += 1
        question = S3VerifyRequest(signed.access_key, signed.scope.text,
                                   signed.string_to_sign, signed.signature)
        try:
            verdict = await self._meta().verify_s3(question)
        except (Unauthenticated, Forbidden, NotFound) as exc:
            # the gateway's own fault (its credential, or a cluster without --auth), not
            # the client's: said as such, never as a missing key or object
            log.error("the metadata server refuses this gateway's signature checks: %s "
                      "(stager s3 --auth needs a cluster with --auth and a token of the "
                      "s3gateway scope: --token-file)", exc.message)
            raise S3Error("ServiceUnavailable", "this gateway cannot check signatures now: "
                          "its operator is told why in its log") from None
        if verdict.refused is not None:
            self._known.pop(slot, None)
            if verdict.refused == "InvalidAccessKeyId":    # no such key, or no longer
                self._refused[signed.access_key] = (now, verdict.message)
                self._refused.trim()        # a key refused again keeps its place
            raise S3Error(verdict.refused, verdict.message)
        assert verdict.signing_key is not None and verdict.token is not None
        known = _Known(bytes.fromhex(verdict.signing_key), verdict.token,
                       verdict.expires or 0, now)
        self._known.put(slot, known)
        return known

    def forget(self) -> None:
        """Drop every remembered answer: the next request of each key asks again."""
        self._known.clear()
        self._refused.clear()

    def _meta(self) -> AsyncClient:
        if self._client is None:
            self._client = AsyncClient(self.meta_url, config=self.config)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
