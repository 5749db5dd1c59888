"""S3 access keys: minted with a stager token, checked for an S3 gateway.

``stager token create --s3`` mints a normal token and an S3 key bound to it
(:meth:`S3KeyService.create`): an access key id, a secret, and a record in the store
of the key id, the token id, and the secret and the token's text sealed under
``AUTH_DIR/s3.key`` (:class:`~stager.auth.sealed.SealedBox`): the database alone
opens nothing.  The secret is shown once, to whoever created it.

An S3 gateway never learns a secret.  It reads a signed request, builds the string
to sign, and asks here (:meth:`S3KeyService.verify`, with its own ``s3gateway``
credential): the answer is the signing key of the signature's date, region and
service (HMAC-derived from the secret, good for that day alone: the gateway checks
the chunk signatures of a signed body with it and remembers it briefly) and the
token's text, which the gateway acts with — so the token's scopes, prefixes, expiry
and revocation apply to every S3 request as to any client's.  A key whose token is
revoked or expired is refused here, from the next verification on.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from ..auth.sealed import SealedBox
from ..auth.sigv4 import Scope, matches, signing_key
from ..errors import Unauthenticated
from ..protocol.authmsg import TokenRequest
from ..protocol.s3keys import S3KeyCreated, S3KeyInfo, S3Verdict, S3VerifyRequest
from .auth import MetaAuth
from .store.s3keys import S3KeyRecord, S3Keys

KEY_FILE = "s3.key"             # under the auth directory, beside the signing key
ALGORITHM = "AWS4-HMAC-SHA256"
_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
# A signature dated further back than a presigned URL may live (7 days), or ahead
# of today, signs nothing any more: a request captured long ago buys nothing.
OLDEST_DAYS, NEWEST_DAYS = 8, 1


def new_access_key() -> str:
    """``STG`` and 17 random upper-case letters and digits: an AWS key id's shape."""
    return "STG" + "".join(secrets.choice(_ALPHABET) for _ in range(17))


def new_secret() -> str:
    """40 random URL-safe characters (240 bits): safe in every client's config."""
    return secrets.token_urlsafe(30)


class S3KeyService:
    """The keys of one metadata server: minted under its authority, sealed with its
    box, kept in its store."""

    def __init__(self, auth: MetaAuth, box: SealedBox, store: S3Keys,
                 clock: Callable[[], float] = time.time) -> None:
        self.auth = auth
        self.box = box
        self.store = store
        self.clock = clock

    async def create(self, request: TokenRequest) -> S3KeyCreated:
        """A new token, and a key bound to it (recorded before either is shown)."""
        text, info = await self.auth.mint(request)
        access_key, secret = new_access_key(), new_secret()
        sealed = self.box.seal({"secret": secret, "token": text})
        await self.store.put_s3_keys([S3KeyRecord(access_key, info.id, sealed,
                                                  int(self.clock()))])
        return S3KeyCreated(text, info, access_key, secret)

    async def list(self) -> list[S3KeyInfo]:
        return [S3KeyInfo(r.access_key, r.token_id, r.created)
                for r in await self.store.list_s3_keys()]

    async def verify(self, req: S3VerifyRequest) -> S3Verdict:
        record = (await self.store.find_s3_keys([req.access_key])).get(req.access_key)
        if record is None:
            return S3Verdict("InvalidAccessKeyId", "The AWS Access Key Id you provided does "
                                                   "not exist in our records.")
        opened = self.box.open(record.sealed)
        try:
            token = self.auth.authenticate(opened["token"])
        except Unauthenticated as exc:
            why = exc.details.get("reason", "refused")
            return S3Verdict("InvalidAccessKeyId", f"The key's stager token is {why}: the "
                                                   "key is no longer valid.")
        date, region, service, _ = req.scope.split("/")
        scope = Scope(date, region, service)
        if not self._recent(date):
            return S3Verdict("AccessDenied", "The signature's date is out of range.")
        lines = req.string_to_sign.split("\n")
        key = signing_key(opened["secret"], scope)
        if len(lines) != 4 or lines[0] != ALGORITHM or lines[2] != scope.text \
                or not matches(key, req.string_to_sign, req.signature):
            return S3Verdict("SignatureDoesNotMatch",
                             "The request signature we calculated does not match the "
                             "signature you provided. Check your key and signing method.")
        return S3Verdict(signing_key=key.hex(), token=opened["token"], token_id=token.id,
                         expires=token.expires)

    def _recent(self, date: str) -> bool:
        try:
            day = datetime.strptime(date, "%Y%m%d").replace(tzinfo=UTC)
        except ValueError:
            return False
        now = datetime.fromtimestamp(self.clock(), UTC)
        return now - timedelta(days=OLDEST_DAYS) <= day <= now + timedelta(days=NEWEST_DAYS)
