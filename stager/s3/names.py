"""Bucket and key names, and where a request's bucket and key are.

A bucket is a top-level directory of the namespace: ``s3://datasets/a/b.tar`` is
``/datasets/a/b.tar``.  Path-style requests carry the bucket first in the path
(``/datasets/a/b.tar``); virtual-hosted-style ones in the host name
(``datasets.s3.example`` with ``--s3-domain s3.example``).

A key maps onto a stager path as it is: its ``/`` separate directories.  So a key
with an empty, ``.`` or ``..`` segment, a NUL or a control character has no path
and is refused (``InvalidArgument``), as is one with a character XML 1.0 cannot
carry (``U+FFFE``: no listing could name it), and one over 1,024 bytes is
``KeyTooLongError`` as on S3.  A path whose percent-encoding is broken (``%ZZ``, a
lone ``%``) or decodes to bytes that are no UTF-8 (``%FF``) is ``InvalidURI``: read
leniently, ``%FF`` and ``%FE`` would both name the key ``U+FFFD``, and ``%ZZ`` the
same key as ``%25ZZ``.  A key ending in ``/`` names a directory (the "folder"
object of S3 consoles): see :mod:`stager.s3.objects`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from ..errors import InvalidPath
from ..protocol import paths
from .errors import S3Error, is_xml_text

MAX_KEY = 1024
# What CreateBucket accepts (S3's rules for new buckets) ...
_NEW_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# ... and what any other request may name: an existing top-level directory
_BUCKET = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,254}$")
HIDDEN = ".s3"      # the gateway's own top-level directory (object attributes)
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


@dataclass(frozen=True)
class Target:
    """What a request names: no bucket (the service), a bucket, or an object."""

    bucket: str = ""
    key: str = ""


def locate(host: str, raw_path: str, domain: str = "") -> Target:
    """The bucket and key of a request, path-style or, under ``domain``,
    virtual-hosted-style (``bucket.domain``)."""
    path = decode_path(raw_path.split("?", 1)[0])
    hostname = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    hostname = hostname.lower()
    if domain and hostname.endswith("." + domain.lower()):
        bucket = hostname[: -len(domain) - 1]
        return Target(check_bucket(bucket), path[1:] if path.startswith("/") else path)
    body = path[1:] if path.startswith("/") else path
    bucket, _, key = body.partition("/")
    return Target(check_bucket(bucket) if bucket else "", key)


def decode_path(raw: str) -> str:
    """A request path's percent-encoding decoded, strictly (``InvalidURI``)."""
    if _BAD_ESCAPE.search(raw):
        raise S3Error("InvalidURI", "Couldn't parse the specified URI: a % is not "
                      "followed by two hexadecimal digits")
    try:
        return unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise S3Error("InvalidURI", "Couldn't parse the specified URI: its "
                      "percent-encoding is not UTF-8") from None


def check_bucket(name: str) -> str:
    if not _BUCKET.match(name) or name == HIDDEN:
        raise S3Error("InvalidBucketName", f"the bucket name {name!r} is not valid",
                      resource=name)
    return name


def check_new_bucket(name: str) -> str:
    if not _NEW_BUCKET.match(name) or ".." in name:
        raise S3Error("InvalidBucketName",
                      "a new bucket's name is 3 to 63 lower-case letters, digits, "
                      "dots and hyphens", resource=name)
    return name


def bucket_path(bucket: str) -> str:
    return "/" + bucket


def object_path(bucket: str, key: str) -> str:
    """The stager path of ``bucket``'s ``key`` (a trailing ``/`` dropped)."""
    if not key:
        raise S3Error("InvalidArgument", "an empty key", resource=f"/{bucket}/")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY:
        raise S3Error("KeyTooLongError", f"the key is over {MAX_KEY} bytes",
                      resource=f"/{bucket}")
    if not is_xml_text(key):
        raise S3Error("InvalidArgument", "the key has a character XML cannot carry, so no "
                      "listing could name it", resource=f"/{bucket}")
    body = key[:-1] if key.endswith("/") else key
    try:
        if not body or body.startswith("/"):
            raise InvalidPath("an empty path segment")
        return paths.normalize(f"/{bucket}/{body}")
    except InvalidPath as exc:
        raise S3Error("InvalidArgument", f"the key {key!r} has no stager path: {exc}",
                      resource=f"/{bucket}") from None


def key_of(bucket: str, path: str) -> str:
    """The key of a stager path below ``bucket``."""
    return path[len(bucket) + 2:]
