"""Strict base64url (stager/auth/b64.py): a text is taken only in its one spelling.

The decoder checks the alphabet and the last character's unused bits itself; these
compare it with the definition (the standard decoder's bytes, taken only when
encoding them gives the text back) over every short text of a mixed alphabet and
over long ones with a character changed.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import random

from stager.auth import b64

CHARS = "AQgw_-Pf09+/=. \u00e9"     # values with and without low bits set, and strangers


def _definition(text: str) -> bytes | None:
    if any(c not in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
           for c in text) or len(text) % 4 == 1:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except binascii.Error:
        return None
    return raw if b64.encode(raw) == text else None


def _decoded(text: str) -> bytes | None:
    try:
        return b64.decode(text)
    except ValueError:
        return None


def test_every_short_text_is_taken_exactly_when_canonical() -> None:
    for n in range(5):
        for chars in itertools.product(CHARS, repeat=n):
            text = "".join(chars)
            assert _decoded(text) == _definition(text), repr(text)


def test_a_long_text_with_one_character_changed() -> None:
    rng = random.Random(30)
    for size in (1, 2, 3, 64, 5600):
        text = b64.encode(rng.randbytes(size))
        assert _decoded(text) == base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        for _ in range(200):
            i = rng.choice([len(text) - 1, rng.randrange(len(text))])
            changed = text[:i] + rng.choice(CHARS) + text[i + 1:]
            assert _decoded(changed) == _definition(changed), (size, i)
