"""AWS Signature Version 4 as S3 speaks it: pure functions, no I/O, no secrets kept.

A signed request is checked in two halves, so that the secret never leaves the
metadata server (stager/s3/auth.py says who does which):

1. :func:`parse` reads what the request claims (``Authorization: AWS4-HMAC-SHA256
   Credential=…, SignedHeaders=…, Signature=…``, or a presigned URL's ``X-Amz-*``
   query), checks its shape and its time (:func:`check_time`: 15 minutes of clock
   skew, a presigned URL's expiry of at most 7 days), and builds the canonical
   request and the string to sign from the request as it arrived.
2. Whoever holds the secret derives the day's signing key (:func:`signing_key`, in
   stager/auth/sigv4.py, left of the servers) and compares (:func:`verify`, constant
   time).  The signing key, valid for one date,
   region and service, is all a gateway needs to check the chunk signatures of a
   signed ``aws-chunked`` body (:class:`ChunkChain`).

S3's canonical URI is the path encoded once (never twice, never normalized): the
path as sent is decoded and encoded again with SigV4's rules, so every client's
spelling of the same key (``~`` or ``%7E``) gives the same canonical form.  The query
is decoded and re-encoded pair by pair and sorted; a presigned URL's signature is
left out of it.

Everything refused is an :class:`~stager.s3.errors.S3Error` with S3's own code:
``AuthorizationHeaderMalformed``, ``AuthorizationQueryParametersError``,
``RequestTimeTooSkewed``, ``AccessDenied`` (an expired presigned URL),
``SignatureDoesNotMatch``.
"""

from __future__ import annotations

import calendar
import hashlib
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from email.utils import parsedate_tz
from urllib.parse import quote, unquote

from ..auth.sigv4 import TERMINATOR, Scope, matches, sign, signing_key
from .errors import S3Error

__all__ = ["Scope", "SignedRequest", "ChunkChain", "check_time", "matches", "parse",
           "parse_scope", "sign", "signing_key", "verify"]

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
SIGNED_CHUNKS = frozenset({STREAMING_SIGNED, STREAMING_SIGNED_TRAILER})
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
MAX_SKEW = 15 * 60                  # seconds a request's date may be off the gateway's clock
MAX_PRESIGNED = 7 * 86400           # seconds a presigned URL may live (S3's limit)
AMZ_DATE = "%Y%m%dT%H%M%SZ"
MAX_SIGNED_HEADERS = 64

_HEX64 = re.compile(r"[0-9a-f]{64}")
_DATE8 = re.compile(r"\d{8}")
_AMZ_DATE = re.compile(r"\d{8}T\d{6}Z")
_HEADER_NAME = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]+")
_SPACES = re.compile(r"\s+")
_UNRESERVED = "-_.~"                # with letters and digits: never encoded


def parse_scope(text: str) -> Scope:
    """``DATE/REGION/SERVICE/aws4_request`` (:class:`S3Error` when it is not)."""
    parts = text.split("/")
    if len(parts) != 4 or parts[3] != TERMINATOR or not _DATE8.fullmatch(parts[0]) \
            or not parts[1] or not parts[2]:
        raise S3Error("AuthorizationHeaderMalformed",
                      f"the credential scope {text!r} is not DATE/REGION/SERVICE/{TERMINATOR}")
    return Scope(parts[0], parts[1], parts[2])


@dataclass(frozen=True)
class SignedRequest:
    """What a signed request claims, and the string its signature must sign."""

    access_key: str
    scope: Scope
    amz_date: str                   # YYYYMMDDTHHMMSSZ: when it was signed
    signature: str                  # 64 lowercase hex digits
    payload_hash: str               # a hex SHA-256, UNSIGNED-PAYLOAD or a STREAMING-… mode
    string_to_sign: str
    expires: int | None = None      # a presigned URL: seconds it is valid from amz_date

    @property
    def presigned(self) -> bool:
        return self.expires is not None

    @property
    def signed_chunks(self) -> bool:
        """Is the body ``aws-chunked`` with a signature on every chunk?"""
        return self.payload_hash in SIGNED_CHUNKS


# -- encoding ---------------------------------------------------------------------------
def uri_encode(text: str, *, keep_slash: bool) -> str:
    """SigV4's encoding: every byte of the UTF-8 but letters, digits and ``-_.~`` as
    ``%XX`` (upper-case hex); ``/`` kept where ``keep_slash`` (a path)."""
    return quote(text, safe=_UNRESERVED + ("/" if keep_slash else ""))


def canonical_uri(raw_path: str) -> str:
    """The path as sent (still percent-encoded), in S3's canonical form: decoded once
    and encoded once, never normalized (``/a//b/../c`` is a key like any other)."""
    return uri_encode(unquote(raw_path or "/"), keep_slash=True)


def query_pairs(raw_query: str) -> list[tuple[str, str]]:
    """The decoded ``(name, value)`` pairs of a raw query string, in order; a name
    without ``=`` has the value ``""``."""
    pairs = []
    for part in raw_query.split("&"):
        if part:
            name, _, value = part.partition("=")
            pairs.append((unquote(name), unquote(value)))
    return pairs


def canonical_query(pairs: Iterable[tuple[str, str]]) -> str:
    encoded = sorted((uri_encode(k, keep_slash=False), uri_encode(v, keep_slash=False))
                     for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in encoded)


def canonical_headers(headers: Iterable[tuple[str, str]],
                      signed: tuple[str, ...]) -> str:
    """The signed headers' lines, ``name:value\\n`` each: the values of a repeated
    header joined by ``,``, each trimmed and its runs of spaces made one."""
    values: dict[str, list[str]] = {name: [] for name in signed}
    for name, value in headers:
        lower = name.lower()
        if lower in values:
            values[lower].append(_SPACES.sub(" ", value.strip()))
    return "".join(f"{name}:{','.join(values[name])}\n" for name in signed)


def canonical_request(method: str, raw_path: str, pairs: Iterable[tuple[str, str]],
                      headers: Iterable[tuple[str, str]], signed: tuple[str, ...],
                      payload_hash: str) -> str:
    return "\n".join((method.upper(), canonical_uri(raw_path), canonical_query(pairs),
                      canonical_headers(headers, signed), ";".join(signed), payload_hash))


def string_to_sign(amz_date: str, scope: Scope, canonical: str) -> str:
    return "\n".join((ALGORITHM, amz_date, scope.text,
                      hashlib.sha256(canonical.encode()).hexdigest()))


# -- signatures ------------------------------------------------------------------------
def verify(key: bytes, signed: SignedRequest) -> None:
    """:class:`S3Error` ``SignatureDoesNotMatch`` unless ``key`` made the signature."""
    if not matches(key, signed.string_to_sign, signed.signature):
        raise S3Error("SignatureDoesNotMatch",
                      "The request signature we calculated does not match the signature "
                      "you provided. Check your key and signing method.")


# -- reading a request ------------------------------------------------------------------
def parse(method: str, raw_path: str, headers: Iterable[tuple[str, str]]
          ) -> SignedRequest | None:
    """What the request (its method, its raw target ``/path?query`` as sent, its
    headers) claims; ``None`` when it is not signed at all.  Its time is not checked
    here (:func:`check_time`)."""
    headers = list(headers)
    path, _, raw_query = raw_path.partition("?")
    pairs = query_pairs(raw_query)
    authorization = _header(headers, "authorization")
    if any(k == "X-Amz-Algorithm" for k, _ in pairs):
        return _presigned(method, path, pairs, headers)
    if authorization is None:
        if {"AWSAccessKeyId", "Signature"} <= {k for k, _ in pairs}:
            raise _version_2()
        return None
    return _header_signed(method, path, pairs, headers, authorization)


def _header_signed(method: str, path: str, pairs: list[tuple[str, str]],
                   headers: list[tuple[str, str]], authorization: str) -> SignedRequest:
    algorithm, _, rest = authorization.strip().partition(" ")
    if algorithm == "AWS":
        raise _version_2()
    if algorithm != ALGORITHM:
        raise S3Error("AuthorizationHeaderMalformed",
                      f"only {ALGORITHM} (Signature Version 4) is supported")
    fields: dict[str, str] = {}
    for item in rest.split(","):
        name, eq, value = item.strip().partition("=")
        if not eq or name in fields:
            raise S3Error("AuthorizationHeaderMalformed",
                          f"the Authorization header is not '{ALGORITHM} Credential=…, "
                          "SignedHeaders=…, Signature=…'")
        fields[name] = value.strip()
    if set(fields) != {"Credential", "SignedHeaders", "Signature"}:
        raise S3Error("AuthorizationHeaderMalformed",
                      "the Authorization header needs Credential, SignedHeaders and "
                      "Signature, and nothing else")
    access_key, scope = _credential(fields["Credential"])
    amz_date = _header(headers, "x-amz-date")
    if amz_date is None:
        amz_date = _from_http_date(_header(headers, "date"))
    payload_hash = _header(headers, "x-amz-content-sha256")
    if payload_hash is None:
        raise S3Error("InvalidRequest",
                      "Missing required header for this request: x-amz-content-sha256")
    signed = _signed_headers(fields["SignedHeaders"])
    return _claim(access_key, scope, amz_date, fields["Signature"], payload_hash, None,
                  canonical_request(method, path, pairs, headers, signed, payload_hash))


def _presigned(method: str, path: str, pairs: list[tuple[str, str]],
               headers: list[tuple[str, str]]) -> SignedRequest:
    query: dict[str, str] = {}
    for name, value in pairs:
        if name.startswith("X-Amz-"):
            if name in query:
                raise _query_error(f"{name} is given twice")
            query[name] = value
    missing = {"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires",
               "X-Amz-SignedHeaders", "X-Amz-Signature"} - set(query)
    if missing:
        raise _query_error("a presigned URL needs " + ", ".join(sorted(missing)))
    if query["X-Amz-Algorithm"] != ALGORITHM:
        raise _query_error(f"X-Amz-Algorithm only supports {ALGORITHM}")
    expires = query["X-Amz-Expires"]
    # isascii: str.isdigit() is true of "²", which int() refuses (a 500, not a 400)
    if not (expires.isascii() and expires.isdigit()) or len(expires) > 9:
        raise _query_error("X-Amz-Expires should be a number")
    if not 1 <= int(expires) <= MAX_PRESIGNED:
        raise _query_error("X-Amz-Expires must be from 1 to a week (in seconds) that is "
                           f"{MAX_PRESIGNED}")
    access_key, scope = _credential(query["X-Amz-Credential"])
    signed = _signed_headers(query["X-Amz-SignedHeaders"])
    payload_hash = query.get("X-Amz-Content-Sha256", UNSIGNED_PAYLOAD)
    kept = [(k, v) for k, v in pairs if k != "X-Amz-Signature"]
    return _claim(access_key, scope, query["X-Amz-Date"], query["X-Amz-Signature"],
                  payload_hash, int(expires),
                  canonical_request(method, path, kept, headers, signed, payload_hash))


def _claim(access_key: str, scope: Scope, amz_date: str, signature: str, payload_hash: str,
           expires: int | None, canonical: str) -> SignedRequest:
    if not _AMZ_DATE.fullmatch(amz_date) or _when(amz_date) is None:
        raise S3Error("AccessDenied" if expires is None else
                      "AuthorizationQueryParametersError",
                      f"the request's date {amz_date!r} is not YYYYMMDDTHHMMSSZ")
    if amz_date[:8] != scope.date:
        raise S3Error("AuthorizationHeaderMalformed",
                      f"the credential's date {scope.date} is not the request's "
                      f"({amz_date[:8]})")
    if scope.service != "s3":
        raise S3Error("AuthorizationHeaderMalformed",
                      f"the credential is for the service {scope.service!r}, not 's3'")
    if not _HEX64.fullmatch(signature):
        raise S3Error("SignatureDoesNotMatch" if expires is None else
                      "AuthorizationQueryParametersError",
                      "a signature is 64 lowercase hex digits")
    return SignedRequest(access_key, scope, amz_date, signature, payload_hash,
                         string_to_sign(amz_date, scope, canonical), expires)


def check_time(signed: SignedRequest, now: float) -> None:
    """A header-signed request within :data:`MAX_SKEW` of ``now``; a presigned URL not
    before its date (less the skew) nor after its expiry."""
    at = _when(signed.amz_date) or 0
    if signed.expires is None:
        if abs(now - at) > MAX_SKEW:
            raise S3Error("RequestTimeTooSkewed",
                          "The difference between the request time and the current time "
                          "is too large.")
        return
    if now < at - MAX_SKEW:
        raise S3Error("AccessDenied", "Request is not valid yet")
    if now > at + signed.expires:
        raise S3Error("AccessDenied", "Request has expired")


def _when(amz_date: str) -> int | None:
    """Unix seconds of an amz date; ``None`` for one no calendar has (month 13)."""
    try:
        return calendar.timegm(time.strptime(amz_date, AMZ_DATE))
    except ValueError:
        return None


def _credential(text: str) -> tuple[str, Scope]:
    access_key, slash, scope = text.partition("/")
    if not slash or not access_key:
        raise S3Error("AuthorizationHeaderMalformed",
                      "a credential is ACCESS_KEY/DATE/REGION/SERVICE/aws4_request")
    return access_key, parse_scope(scope)


def _signed_headers(text: str) -> tuple[str, ...]:
    names = tuple(text.split(";"))
    if not 1 <= len(names) <= MAX_SIGNED_HEADERS \
            or not all(_HEADER_NAME.fullmatch(n) for n in names) \
            or list(names) != sorted(set(names)):
        raise S3Error("AuthorizationHeaderMalformed",
                      "SignedHeaders is the signed headers' lower-case names, sorted, "
                      "separated by ';'")
    if "host" not in names:
        raise S3Error("AuthorizationHeaderMalformed", "the host header must be signed")
    return names


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.strip()
    return None


def _from_http_date(text: str | None) -> str:
    """A ``Date:`` header (RFC 7231) as an amz date; ``""`` (refused later) if none."""
    try:
        parsed = parsedate_tz(text) if text else None
        if parsed is None:
            return ""
        offset = parsed[9] or 0
        at = calendar.timegm(parsed[:6] + (0, 1, -1)) - offset     # type: ignore[arg-type]
        return time.strftime(AMZ_DATE, time.gmtime(at))
    except (ValueError, OverflowError, OSError):        # a date past what time can say
        return ""


def _version_2() -> S3Error:
    return S3Error("InvalidRequest",
                   "The authorization mechanism you have provided is not supported. Please "
                   f"use {ALGORITHM} (boto3: Config(signature_version='s3v4')).")


def _query_error(message: str) -> S3Error:
    return S3Error("AuthorizationQueryParametersError", message)


# -- signed aws-chunked bodies ----------------------------------------------------------
class ChunkChain:
    """The signature chain of a signed ``aws-chunked`` body: each chunk's signature
    signs its SHA-256 and the signature before it (the first, the request's own), so
    no chunk can be changed, dropped, reordered or added; the trailer's signs the
    trailing headers and the final chunk's.  A link refused breaks the chain."""

    def __init__(self, key: bytes, amz_date: str, scope: Scope, seed: str) -> None:
        self._key = key
        self._head = f"{amz_date}\n{scope.text}\n"
        self._previous: str | None = seed

    def chunk(self, payload_sha256: str, signature: str) -> None:
        text = (f"{ALGORITHM}-PAYLOAD\n{self._head}{self._link()}\n{EMPTY_SHA256}\n"
                f"{payload_sha256}")
        self._check(text, signature)

    def trailer(self, trailer: bytes, signature: str) -> None:
        """``trailer``: the trailing header lines, each ``name:value\\n``."""
        text = (f"{ALGORITHM}-TRAILER\n{self._head}{self._link()}\n"
                f"{hashlib.sha256(trailer).hexdigest()}")
        self._check(text, signature)

    def _link(self) -> str:
        if self._previous is None:
            raise _chunk_refused()
        return self._previous

    def _check(self, text: str, signature: str) -> None:
        if not matches(self._key, text, signature):
            self._previous = None
            raise _chunk_refused()
        self._previous = signature


def _chunk_refused() -> S3Error:
    return S3Error("SignatureDoesNotMatch",
                   "a chunk's signature does not match: the body was changed, or signed "
                   "with another key")
