"""The half of AWS Signature Version 4 that needs the secret: the signing key, and the
signature compare.

The metadata server holds S3 secrets (sealed, stager/meta/s3keys.py) and checks an S3
gateway's signatures with these; the gateway reads requests (stager/s3/sigv4.py) and,
with the signing key the metadata server hands it, checks the chunk signatures of
one day, region and service.  Nothing here reads a request.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

TERMINATOR = "aws4_request"


@dataclass(frozen=True)
class Scope:
    """The credential scope: one access key's signing key is good for this date,
    region and service alone."""

    date: str                       # YYYYMMDD
    region: str
    service: str

    @property
    def text(self) -> str:
        return f"{self.date}/{self.region}/{self.service}/{TERMINATOR}"


def signing_key(secret: str, scope: Scope) -> bytes:
    """The key of one day, region and service, derived from the secret (HMAC chain)."""
    key = _hmac(("AWS4" + secret).encode(), scope.date)
    for part in (scope.region, scope.service, TERMINATOR):
        key = _hmac(key, part)
    return key


def sign(key: bytes, text: str) -> str:
    """The hex signature of ``text`` with a signing key."""
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def matches(key: bytes, text: str, signature: str) -> bool:
    """Does ``signature`` sign ``text`` with ``key``?  Constant time."""
    return hmac.compare_digest(sign(key, text).encode(), signature.encode())


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()
