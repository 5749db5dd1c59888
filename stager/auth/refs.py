"""Capabilities by reference: a short name for a capability text a data server verified.

A batch capability is ~7.6 KB of text, and a client's every request to a data
server carried it whole in ``X-Stager-Capability``: the client built the header,
the server parsed it and hashed it to find it in its cache, for each small
file.  Once a data server has verified a text (its
:class:`~stager.auth.cache.CapabilityCache` keeps it), a client may send
``ref1.<id>`` instead, ``<id>`` being :func:`reference` of the text: 24
characters.

The id is never trusted for what it says: a server only resolves ids it computed
itself from texts it verified and keeps, and then checks the text's claims
(expiry, operation, target, files) exactly as for the text sent whole.  An id it
does not hold (never seen, evicted, expired, or the server restarted) is a 401
with ``reason`` :data:`UNKNOWN`, and the client sends the texts again.  A
reference verified by one server means nothing to another.
"""

from __future__ import annotations

import hashlib

from . import b64

PREFIX = "ref1."            # a capability text starts with its version, "stg1."
UNKNOWN = "unknown_reference"   # the 401's details["reason"] for an id not held
ID_BYTES = 18               # of SHA-256: 144 bits, 24 characters of base64url


def reference(text: str) -> str:
    """``ref1.<id>`` for the capability ``text`` (ASCII, as every verified text is)."""
    return PREFIX + b64.encode(hashlib.sha256(text.encode("ascii", "replace"))
                               .digest()[:ID_BYTES])
