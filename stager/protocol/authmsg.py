"""The JSON bodies of the token and capability routes (stager/meta/http/authapp.py).

Tokens are minted, listed and revoked through the metadata server, which alone
holds the signing key; what it keeps of each (:class:`TokenInfo`) never
includes the token's text, which is shown once, to whoever created it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import BadRequest
from .batch import parse_items
from .models import TargetInfo, check_file_id, count_of, field_of

MAX_TTL = 10 * 365 * 86400      # seconds: a token lives at most ten years


@dataclass(frozen=True)
class TokenRequest:
    """``stager token create``: what the new token may do, where, and for how long."""

    scopes: tuple[str, ...]
    prefixes: tuple[str, ...] = ("/",)
    ttl: int = 86400
    name: str = ""
    uses: int | None = None         # a join token: how many new targets it may register

    def to_json(self) -> dict[str, Any]:
        return {"scopes": list(self.scopes), "prefixes": list(self.prefixes),
                "ttl": self.ttl, "name": self.name, "uses": self.uses}

    @classmethod
    def from_json(cls, obj: Any) -> TokenRequest:
        scopes = field_of(obj, "scopes", list)
        prefixes = field_of(obj, "prefixes", list, ["/"])
        if not all(isinstance(s, str) for s in scopes + prefixes):
            raise BadRequest("scopes and prefixes are lists of strings")
        ttl = count_of(obj, "ttl", 86400)
        if not 1 <= ttl <= MAX_TTL:
            raise BadRequest(f"ttl is 1 to {MAX_TTL} seconds", ttl=ttl)
        if "target" in scopes:
            raise BadRequest("target credentials are minted by the metadata server when a "
                             "target first registers, not by `token create`")
        uses = field_of(obj, "uses", int, None)
        if uses is not None and (uses < 1 or scopes != ["join"]):
            raise BadRequest("uses (1 or more) limits a token of the join scope alone",
                             uses=uses)
        return cls(tuple(scopes), tuple(prefixes), ttl, field_of(obj, "name", str, ""), uses)


@dataclass(frozen=True)
class TokenInfo:
    """What the metadata server keeps of a token it minted (never its text)."""

    id: str
    name: str
    scopes: tuple[str, ...]
    prefixes: tuple[str, ...]
    created: int
    expires: int
    revoked: int | None = None      # unix seconds it was revoked, if it was
    uses: int | None = None         # registrations a join token has left (None: no limit)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "scopes": list(self.scopes),
                "prefixes": list(self.prefixes), "created": self.created,
                "expires": self.expires, "revoked": self.revoked, "uses": self.uses}

    @classmethod
    def from_json(cls, obj: Any) -> TokenInfo:
        return cls(field_of(obj, "id", str), field_of(obj, "name", str),
                   tuple(field_of(obj, "scopes", list)), tuple(field_of(obj, "prefixes", list)),
                   count_of(obj, "created"), count_of(obj, "expires"),
                   field_of(obj, "revoked", int, None), field_of(obj, "uses", int, None))


@dataclass(frozen=True)
class TokenCreated:
    token: str
    info: TokenInfo

    def to_json(self) -> dict[str, Any]:
        return {"token": self.token, "info": self.info.to_json()}

    @classmethod
    def from_json(cls, obj: Any) -> TokenCreated:
        return cls(field_of(obj, "token", str), TokenInfo.from_json(field_of(obj, "info", dict)))


@dataclass(frozen=True)
class TokenList:
    tokens: tuple[TokenInfo, ...]

    def to_json(self) -> dict[str, Any]:
        return {"tokens": [t.to_json() for t in self.tokens]}

    @classmethod
    def from_json(cls, obj: Any) -> TokenList:
        return cls(tuple(TokenInfo.from_json(t) for t in field_of(obj, "tokens", list)))


@dataclass(frozen=True)
class CapabilityRequest:
    """Capabilities for ``op`` ("read" or "write") on chunks of each file id: a
    committed file for read, a file being written (an upload) for write."""

    op: str
    file_ids: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "file_ids": list(self.file_ids)}

    @classmethod
    def from_json(cls, obj: Any) -> CapabilityRequest:
        op = field_of(obj, "op", str)
        if op not in ("read", "write"):
            raise BadRequest("op is 'read' or 'write'", op=op)
        return cls(op, tuple(parse_items(obj, check_file_id, key=str, name="file_ids")))


@dataclass(frozen=True)
class PublicKey:
    public_key: str             # PEM (SubjectPublicKeyInfo)

    def to_json(self) -> dict[str, Any]:
        return {"public_key": self.public_key}

    @classmethod
    def from_json(cls, obj: Any) -> PublicKey:
        return cls(field_of(obj, "public_key", str))


@dataclass(frozen=True)
class TargetRegistered:
    """A registration's answer: the target as stored, and the target's own credential,
    minted at its first registration and shown this once (``None`` when it showed its
    own credential, or auth is off) — stager/meta/targetauth.py."""

    target: TargetInfo
    credential: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {**self.target.to_json(), "credential": self.credential}

    @classmethod
    def from_json(cls, obj: Any) -> TargetRegistered:
        return cls(TargetInfo.from_json(obj), field_of(obj, "credential", str, None))
