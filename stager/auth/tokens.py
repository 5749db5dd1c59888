"""Tokens and capabilities: signed claims, and their one compact wire form.

Two kinds of claims, both frozen dataclasses:

- :class:`Token`: what a user, a team or a data server holds (``Authorization:
  Bearer``).  An id (revocable), a name (for the audit log), scopes, the path
  prefixes it is limited to, an expiry.
- :class:`Capability`: what the metadata server hands a client with a layout,
  for one file id and one operation, valid a few minutes
  (:data:`CAPABILITY_TTL`).  Data servers check it with the public key alone, so
  they never see user tokens and never ask the metadata server.  A *batch*
  capability names up to :data:`MAX_BATCH_FILES` files (file ``"+"``, the ids in
  ``files``): a Loader's plan of many small files costs one signature and one
  verification per batch, not per file, and still grants only the files named.

Wire form, for both::

    stg1.<base64url(JSON claims)>.<base64url(Ed25519 signature)>

The JSON is canonical (sorted keys, no spaces) and carries ``"typ"``
(``"token"`` or ``"cap"``); the signature covers the ASCII text
``stg1.<payload>``, so any change to any character, the version included,
breaks it.  Base64 is strict (:mod:`stager.auth.b64`): a text has one spelling.

:func:`verify` checks, in this order: shape and version, strict base64, the
signature (``cryptography``'s Ed25519, whose check does not depend on where the
signature differs), and only then parses the JSON — text no key of ours signed is
never parsed.  Then exact fields, types and values, then expiry with
:data:`CLOCK_SKEW` of grace.  Every failure is one
:class:`~stager.errors.Unauthenticated` with a ``reason`` detail; nothing else
escapes, and no message repeats the token.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from ..errors import BadRequest, Unauthenticated
from ..protocol.models import TARGET_ID_RE
from ..protocol.paths import normalize
from . import b64
from .revocation import Revocations

VERSION = "stg1"
SCOPES = frozenset({"read", "write", "admin", "join", "target",
                    "telemetry",    # a Loader reporting its job (stager/meta/jobtable.py)
                    "s3gateway"})   # an S3 gateway checking signatures (stager/s3/auth.py)
OPS = frozenset({"read", "write"})
CLUSTER = "cluster"         # the metadata server's own capability for one target's
                            # maintenance routes (purge, scrub, listings, deletes)
ANY_FILE = "*"              # a server capability's file: every file, on its one target
BATCH = "+"                 # a batch capability's file: exactly the files it names
MAX_BATCH_FILES = 256       # file ids in one batch capability: its text stays under MAX_TEXT
FILE_ID_BYTES = 16          # a file id's 32 hex digits, as bytes in a batch's ``files``
CLOCK_SKEW = 30             # seconds a token stays good past its expiry: clocks differ
CAPABILITY_TTL = 600        # seconds; clients fetch a fresh one before it runs out
MAX_TEXT = 8192             # characters; a longer "token" is refused unread
MAX_NAME = 200
MAX_PREFIXES = 64
SIGNATURE_BYTES = 64
_ID = re.compile(r"[0-9a-f]{32}")
_IDS = re.compile(r"[0-9a-f]{32}(?:,[0-9a-f]{32})*")     # file ids joined by commas


@dataclass(frozen=True)
class Token:
    """A bearer token's claims.  Built checked: a bad field is a :class:`BadRequest`."""

    id: str
    name: str
    scopes: frozenset[str]
    prefixes: tuple[str, ...]
    expires: int                # unix seconds
    target: str | None = None   # a target credential's one target (scope "target")

    def __post_init__(self) -> None:
        _check_id(self.id, "token id")
        # Printable only: the name goes into audit log lines as it is.
        if not isinstance(self.name, str) or len(self.name) > MAX_NAME \
                or not self.name.isprintable():
            raise BadRequest(f"a token name is up to {MAX_NAME} printable characters")
        scopes = frozenset(_strings(self.scopes, "scopes"))
        if not scopes or not scopes <= SCOPES:
            raise BadRequest(f"scopes must be a non-empty subset of {sorted(SCOPES)}")
        prefixes = tuple(sorted({normalize(p) for p in _strings(self.prefixes, "prefixes")}))
        if not 1 <= len(prefixes) <= MAX_PREFIXES:
            raise BadRequest(f"a token has 1 to {MAX_PREFIXES} prefixes ('/' for all)")
        _check_time(self.expires)
        if (self.target is not None) != ("target" in scopes):
            raise BadRequest("a target credential has the scope 'target' and names its "
                             "target; no other token does")
        if self.target is not None:
            _check_target(self.target)
            if scopes != {"target"}:
                raise BadRequest("a target credential has no other scope")
        object.__setattr__(self, "scopes", scopes)
        object.__setattr__(self, "prefixes", prefixes)

    @classmethod
    def new(cls, name: str, scopes: Any, prefixes: Any, ttl: float, now: float,
            target: str | None = None) -> Token:
        """A token with a fresh random id, valid ``ttl`` seconds from ``now``.

        ``scopes`` and ``prefixes`` are collections of strings; a bare string is
        refused (``"/a"`` must not become the prefixes ``"/"`` and ``"/a"``)."""
        return cls(secrets.token_hex(16), name, frozenset(_strings(scopes, "scopes")),
                   tuple(_strings(prefixes, "prefixes")), int(now + ttl), target)

    def to_json(self) -> dict[str, Any]:
        out = {"typ": "token", "id": self.id, "name": self.name,
               "scopes": sorted(self.scopes), "prefixes": list(self.prefixes),
               "exp": self.expires}
        if self.target is not None:
            out["target"] = self.target
        return out


@dataclass(frozen=True)
class Capability:
    """Permission for one operation on one file, for a data server to check alone.

    ``holder`` is the id of the token it was issued to, for the data server's
    audit log.  A client's capability names one file and no target.  The metadata
    server's own (rebuild copies, purges, scrubs, listings, the gateway) names every
    file (:data:`ANY_FILE`) but exactly one ``target``: the data server it is sent
    to, which is the only one that takes it, so a target can never replay what it
    receives against another."""

    file_id: str
    op: str                     # "read" | "write" | "cluster"
    expires: int                # unix seconds
    holder: str
    target: str | None = None   # a server capability's one target
    files: frozenset[str] = frozenset()     # a batch capability's files (file BATCH)

    def __post_init__(self) -> None:
        if self.op not in OPS | {CLUSTER}:
            raise BadRequest(f"a capability's op is one of {sorted(OPS | {CLUSTER})}")
        if self.files and self.file_id != BATCH:
            raise BadRequest(f"only a batch capability (file {BATCH!r}) names files")
        if self.file_id == ANY_FILE or self.op == CLUSTER:
            if self.file_id != ANY_FILE or self.target is None:
                raise BadRequest(f"a server capability is for file {ANY_FILE!r} on one "
                                 "target")
            _check_target(self.target)
        elif self.file_id == BATCH:
            files = _id_set(self.files)
            if not 1 <= len(files) <= MAX_BATCH_FILES or self.target is not None:
                raise BadRequest(f"a batch capability names 1 to {MAX_BATCH_FILES} files "
                                 "and no target")
            object.__setattr__(self, "files", files)
        else:
            _check_id(self.file_id, "file id")
            if self.target is not None:
                raise BadRequest("a client capability names no target")
        _check_time(self.expires)
        _check_id(self.holder, "holder token id")

    @classmethod
    def new(cls, file_id: str, op: str, holder: str, now: float,
            ttl: float = CAPABILITY_TTL, target: str | None = None) -> Capability:
        return cls(file_id, op, int(now + ttl), holder, target)

    @classmethod
    def batch(cls, file_ids: Any, op: str, holder: str, now: float,
              ttl: float = CAPABILITY_TTL) -> Capability:
        """One capability for ``op`` on each of ``file_ids`` (1 to MAX_BATCH_FILES)."""
        return cls(BATCH, op, int(now + ttl), holder, files=file_ids)

    def grants(self, file_id: str | None) -> bool:
        """Does this client capability name ``file_id`` (itself, or among its files)?"""
        if self.file_id == BATCH:
            return file_id in self.files
        return file_id == self.file_id

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"typ": "cap", "op": self.op, "exp": self.expires,
                               "holder": self.holder}
        if self.file_id == BATCH:
            # the ids as bytes, sorted: 22 characters a file, one spelling per set
            out["files"] = b64.encode(bytes.fromhex("".join(sorted(self.files))))
        else:
            out["file"] = self.file_id
        if self.target is not None:
            out["target"] = self.target
        return out


Claims = Token | Capability


def sign(key: Ed25519PrivateKey, claims: Claims) -> str:
    """The wire text of ``claims``, signed with ``key``."""
    payload = json.dumps(claims.to_json(), sort_keys=True, separators=(",", ":"))
    return _seal(key, payload.encode("ascii"))        # json.dumps escapes to ASCII


def verify(public: Ed25519PublicKey, text: str, now: float) -> Claims:
    """The claims of ``text`` if ``public`` signed it and it has not expired.

    Raises only :class:`~stager.errors.Unauthenticated`."""
    claims = _claims(_open(public, text))
    if now > claims.expires + CLOCK_SKEW:
        raise Unauthenticated(f"{_kind(claims)} expired", reason="expired")
    return claims


def verify_token(public: Ed25519PublicKey, text: str, now: float,
                 revocations: Revocations) -> Token:
    """A user's or data server's bearer token: verified, a token (not a capability),
    and not revoked."""
    claims = verify(public, text, now)
    if not isinstance(claims, Token):
        raise Unauthenticated("a capability is not a bearer token", reason="wrong_type")
    if revocations.is_revoked(claims.id):
        raise Unauthenticated("token revoked", reason="revoked")
    return claims


def verify_capability(public: Ed25519PublicKey, text: str, now: float) -> Capability:
    """A capability presented to a data server: verified and a capability."""
    claims = verify(public, text, now)
    if not isinstance(claims, Capability):
        raise Unauthenticated("a data server takes capabilities, not tokens",
                              reason="wrong_type")
    return claims


def expires_at(text: str) -> int:
    """When ``text`` expires, read without a key: for a client deciding when to fetch
    a fresh capability.  Not a check — never grant anything on it.  Only ``exp`` is
    read (a client stores a capability per file: the whole claims cost it twice as
    much), and it must be a plain integer."""
    _, payload, _ = _split(text)
    try:
        exp = json.loads(payload)["exp"]
    except (ValueError, RecursionError, KeyError, TypeError):
        raise Unauthenticated("malformed token: no expiry", reason="malformed") from None
    if type(exp) is not int:
        raise Unauthenticated("malformed token: no expiry", reason="malformed")
    return exp


def _seal(key: Ed25519PrivateKey, payload: bytes) -> str:
    signed = f"{VERSION}.{b64.encode(payload)}"
    return f"{signed}.{b64.encode(key.sign(signed.encode('ascii')))}"


def _split(text: str) -> tuple[str, bytes, bytes]:
    """(signed part, payload, signature) of a well-formed text."""
    if not isinstance(text, str) or len(text) > MAX_TEXT or text.count(".") != 2:
        raise Unauthenticated("malformed token", reason="malformed")
    version, payload, signature = text.split(".")
    if version != VERSION:
        raise Unauthenticated(f"unknown token version (this server reads {VERSION})",
                              reason="version")
    try:
        raw_payload, raw_signature = b64.decode(payload), b64.decode(signature)
    except ValueError:
        raise Unauthenticated("malformed token: bad base64", reason="malformed") from None
    if len(raw_signature) != SIGNATURE_BYTES:
        raise Unauthenticated("malformed token: bad signature length", reason="malformed")
    return f"{version}.{payload}", raw_payload, raw_signature


def _open(public: Ed25519PublicKey, text: str) -> bytes:
    """The payload of ``text`` once its signature checks out."""
    signed, payload, signature = _split(text)
    try:
        public.verify(signature, signed.encode("ascii"))
    except InvalidSignature:
        raise Unauthenticated("token signature does not verify", reason="forged") from None
    return payload


def _claims(payload: bytes) -> Claims:
    try:
        obj = json.loads(payload)
    except (ValueError, RecursionError):     # UnicodeDecodeError is a ValueError
        raise Unauthenticated("malformed token: bad JSON", reason="malformed") from None
    if not isinstance(obj, dict):
        raise Unauthenticated("malformed token: claims are not an object",
                              reason="malformed")
    try:
        return _from_json(obj)
    except BadRequest as exc:
        raise Unauthenticated(f"malformed token: {exc}", reason="malformed") from None


_FIELDS = {"token": {"typ", "id", "name", "scopes", "prefixes", "exp"},
           "cap": {"typ", "op", "exp", "holder"}}
_OPTIONAL = {"token": {"target"}, "cap": {"target", "file", "files"}}


def _from_json(obj: dict[str, Any]) -> Claims:
    typ = obj.get("typ")
    if not isinstance(typ, str) or typ not in _FIELDS:
        raise BadRequest("unknown typ")
    if not _FIELDS[typ] <= set(obj) <= _FIELDS[typ] | _OPTIONAL[typ]:
        raise BadRequest(f"unknown or missing fields in a {typ}")
    target = obj.get("target")
    if "target" in obj and not isinstance(target, str):
        raise BadRequest("a target is a string")
    if typ == "token":
        if not isinstance(obj["scopes"], list) or not isinstance(obj["prefixes"], list):
            raise BadRequest("scopes and prefixes are lists")
        return Token(obj["id"], obj["name"], frozenset(_strings(obj["scopes"], "scopes")),
                     tuple(obj["prefixes"]), obj["exp"], target)
    if ("file" in obj) == ("files" in obj):
        raise BadRequest("a capability names a file or a batch of files")
    if "files" in obj:
        return Capability(BATCH, obj["op"], obj["exp"], obj["holder"], target,
                          _batch_files(obj["files"]))
    return Capability(obj["file"], obj["op"], obj["exp"], obj["holder"], target)


def _batch_files(text: Any) -> frozenset[str]:
    """A batch capability's file ids from their wire form: base64 of the ids' bytes,
    in increasing order (one spelling for one set)."""
    try:
        raw = b64.decode(text)
    except ValueError:
        raise BadRequest("a batch's files are base64url") from None
    if not raw or len(raw) % FILE_ID_BYTES:
        raise BadRequest("a batch's files are whole file ids, in increasing order")
    hexed, step = raw.hex(), 2 * FILE_ID_BYTES      # hex keeps the bytes' order
    ids = [hexed[i:i + step] for i in range(0, len(hexed), step)]
    files = _ReadIds(ids)
    if len(files) != len(ids) or ids != sorted(ids):    # sorted: timsort's one pass
        raise BadRequest("a batch's files are whole file ids, in increasing order")
    return files


class _ReadIds(frozenset[str]):
    """File ids as :func:`_batch_files` reads them off a signed text: each the hex of
    16 bytes, so 32 lowercase hex digits by construction, and :func:`_id_set` does not
    match them a second time (~70 us of a 256-file batch's ~280 us verification)."""


def _strings(values: Any, what: str) -> list[str]:
    if not isinstance(values, list | tuple | set | frozenset) \
            or not all(isinstance(v, str) for v in values):
        raise BadRequest(f"{what} must be a collection of strings")
    return list(values)


def _id_set(values: Any) -> frozenset[str]:
    """A batch's file ids, checked with one match over them all, not one per id:
    checked per id, they took two thirds of a batch's signing and verifying."""
    if type(values) is _ReadIds:
        return values
    try:
        joined = ",".join(values) if isinstance(values, list | tuple | set | frozenset) \
            else None
    except TypeError:                       # not all strings
        joined = None
    if joined is None:
        raise BadRequest("files must be a collection of strings")
    # as many ids matched as values joined: no value hides a comma (so each is one id)
    if len(joined) != 33 * len(values) - 1 or not _IDS.fullmatch(joined):
        raise BadRequest("a file id is 32 lowercase hex digits")
    return values if type(values) is frozenset else frozenset(values)


def _check_id(value: Any, what: str) -> None:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise BadRequest(f"a {what} is 32 lowercase hex digits")


def _check_target(value: Any) -> None:
    if not isinstance(value, str) or not TARGET_ID_RE.match(value):
        raise BadRequest("a target id is 1 to 64 letters, digits, '-', '_' or '.'")


def _check_time(value: Any) -> None:
    if type(value) is not int or not 0 <= value < 2**63:
        raise BadRequest("an expiry is whole unix seconds")


def _kind(claims: Claims) -> str:
    return "token" if isinstance(claims, Token) else "capability"
