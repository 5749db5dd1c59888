"""Strict base64url without padding: one text for each byte string, and no other.

The standard decoder skips characters outside the alphabet and ignores the
unused low bits of the last character, so several texts decode to the same
bytes.  A token must have one spelling only — a flipped bit anywhere in it must
be a different, rejected token — so :func:`decode` accepts a text only if
encoding its bytes gives that text back.
"""

from __future__ import annotations

import base64
import binascii
import re

_ALPHABET = re.compile(r"[A-Za-z0-9_-]*")


def encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode(text: str) -> bytes:
    """The bytes ``text`` spells; :class:`ValueError` for anything not canonical."""
    if not isinstance(text, str) or not _ALPHABET.fullmatch(text) or len(text) % 4 == 1:
        raise ValueError("not base64url")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except binascii.Error:
        raise ValueError("not base64url") from None
    if encode(raw) != text:
        raise ValueError("not canonical base64url")
    return raw
