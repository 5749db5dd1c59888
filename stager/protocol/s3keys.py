"""The bodies of the S3 key routes (stager/meta/http/s3keys.py).

``POST /v1/s3/keys`` (admin) mints a stager token and an S3 access key bound to it
(:class:`S3KeyCreated`: the secret is shown this once); ``GET /v1/s3/keys`` lists
the keys (never a secret).  ``POST /v1/s3/verify`` is an S3 gateway's one question,
asked with its own credential (scope ``s3gateway``): does this signature sign this
string with this key's secret?  The answer (:class:`S3Verdict`) is the signing key
of the signature's date, region and service, and the token to act with — never the
secret — or the S3 error code to refuse the request with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import BadRequest
from .authmsg import TokenInfo
from .models import count_of, field_of

ACCESS_KEY_RE = re.compile(r"^STG[0-9A-Z]{17}$")       # AWS's shape: 20 characters
MAX_STRING_TO_SIGN = 1024       # four short lines
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_SCOPE = re.compile(r"^\d{8}/[^/\s]{1,64}/s3/aws4_request$")
# the S3 error codes a verdict may refuse with
REFUSALS = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied")


@dataclass(frozen=True)
class S3KeyInfo:
    """What ``stager token list`` shows of a key: never its secret."""

    access_key: str
    token_id: str
    created: int

    def to_json(self) -> dict[str, Any]:
        return {"access_key": self.access_key, "token_id": self.token_id,
                "created": self.created}

    @classmethod
    def from_json(cls, obj: Any) -> S3KeyInfo:
        return cls(field_of(obj, "access_key", str), field_of(obj, "token_id", str),
                   count_of(obj, "created"))


@dataclass(frozen=True)
class S3KeyList:
    keys: tuple[S3KeyInfo, ...]

    def to_json(self) -> dict[str, Any]:
        return {"keys": [k.to_json() for k in self.keys]}

    @classmethod
    def from_json(cls, obj: Any) -> S3KeyList:
        return cls(tuple(S3KeyInfo.from_json(k) for k in field_of(obj, "keys", list)))


@dataclass(frozen=True)
class S3KeyCreated:
    """A new token and the S3 key bound to it: both texts shown this once."""

    token: str
    info: TokenInfo
    access_key: str
    secret_key: str

    def to_json(self) -> dict[str, Any]:
        return {"token": self.token, "info": self.info.to_json(),
                "access_key": self.access_key, "secret_key": self.secret_key}

    @classmethod
    def from_json(cls, obj: Any) -> S3KeyCreated:
        return cls(field_of(obj, "token", str), TokenInfo.from_json(field_of(obj, "info", dict)),
                   field_of(obj, "access_key", str), field_of(obj, "secret_key", str))


@dataclass(frozen=True)
class S3VerifyRequest:
    """A gateway's question: does ``signature`` sign ``string_to_sign`` with the secret
    of ``access_key``, in the credential scope ``scope`` (DATE/REGION/s3/aws4_request)?"""

    access_key: str
    scope: str
    string_to_sign: str
    signature: str

    def to_json(self) -> dict[str, Any]:
        return {"access_key": self.access_key, "scope": self.scope,
                "string_to_sign": self.string_to_sign, "signature": self.signature}

    @classmethod
    def from_json(cls, obj: Any) -> S3VerifyRequest:
        access_key, scope = field_of(obj, "access_key", str), field_of(obj, "scope", str)
        text, signature = field_of(obj, "string_to_sign", str), field_of(obj, "signature", str)
        if len(access_key) > 128 or not access_key.isprintable():
            raise BadRequest("an access key is up to 128 printable characters")
        if not _SCOPE.match(scope):
            raise BadRequest("scope is DATE/REGION/s3/aws4_request")
        if len(text) > MAX_STRING_TO_SIGN or not _HEX64.match(signature):
            raise BadRequest(f"a string to sign is up to {MAX_STRING_TO_SIGN} characters "
                             "and a signature 64 lowercase hex digits")
        return cls(access_key, scope, text, signature)


@dataclass(frozen=True)
class S3Verdict:
    """The answer: ``refused`` (an S3 error code of :data:`REFUSALS`) with its
    ``message``, or the day's ``signing_key`` (hex) and the ``token`` to act with,
    good until ``expires`` (unix seconds: the token's expiry)."""

    refused: str | None = None
    message: str = ""
    signing_key: str | None = None
    token: str | None = None
    token_id: str | None = None
    expires: int | None = None

    def to_json(self) -> dict[str, Any]:
        if self.refused is not None:
            return {"refused": self.refused, "message": self.message}
        return {"signing_key": self.signing_key, "token": self.token,
                "token_id": self.token_id, "expires": self.expires}

    @classmethod
    def from_json(cls, obj: Any) -> S3Verdict:
        refused = field_of(obj, "refused", str, None)
        if refused is not None:
            if refused not in REFUSALS:
                raise BadRequest(f"a refusal is one of {REFUSALS}")
            return cls(refused, field_of(obj, "message", str, ""))
        key = field_of(obj, "signing_key", str)
        if not _HEX64.match(key):
            raise BadRequest("a signing key is 64 lowercase hex digits")
        return cls(None, "", key, field_of(obj, "token", str), field_of(obj, "token_id", str),
                   count_of(obj, "expires"))


_STR = {"type": "string"}
_INT = {"type": "integer"}


def _obj(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required)}


SCHEMAS: dict[str, Any] = {
    "S3KeyCreated": _obj({"token": _STR, "info": {"$ref": "#/components/schemas/TokenInfo"},
                          "access_key": _STR, "secret_key": _STR},
                         ("token", "info", "access_key", "secret_key")),
    "S3KeyList": _obj({"keys": {"type": "array", "items": _obj(
        {"access_key": _STR, "token_id": _STR, "created": _INT},
        ("access_key", "token_id", "created"))}}, ("keys",)),
    "S3VerifyRequest": _obj({"access_key": {**_STR, "maxLength": 128},
                             "scope": {**_STR, "pattern": _SCOPE.pattern},
                             "string_to_sign": {**_STR, "maxLength": MAX_STRING_TO_SIGN},
                             "signature": {**_STR, "pattern": _HEX64.pattern}},
                            ("access_key", "scope", "string_to_sign", "signature")),
    # either refused (with its message), or the signing key, token, its id and expiry
    "S3Verdict": _obj({"refused": {"enum": list(REFUSALS)}, "message": _STR,
                       "signing_key": {**_STR, "pattern": _HEX64.pattern}, "token": _STR,
                       "token_id": _STR, "expires": _INT}),
}
