"""Authentication and authorization, as a pure library: keys, tokens, capabilities, policy.

Nothing here speaks HTTP or touches a server; the servers, the client and the
CLI wire it in.  How each side will use it:

- **Metadata server** (``stager meta --auth``): :func:`~stager.auth.keys.load_or_create_key`
  under ``ROOT/auth/`` at start-up; its public half,
  :func:`~stager.auth.keys.public_key_text`, goes into ``cluster.json`` and to data
  servers.  Per request the middleware takes ``Authorization: Bearer T`` and calls
  :func:`~stager.auth.tokens.verify_token` (signature, expiry, revocation; a failure
  is :class:`~stager.errors.Unauthenticated`, 401), then the handler's route asks
  :func:`~stager.auth.policy.require` for its scope and path (a refusal is
  :class:`~stager.errors.Forbidden`, 403).  Listings keep only entries for which
  :func:`~stager.auth.policy.visible` holds.  With a layout it answers, it mints a
  :class:`~stager.auth.tokens.Capability` for that file id and operation with
  :func:`~stager.auth.tokens.sign`.  ``stager token create`` builds a
  :class:`~stager.auth.tokens.Token` with :meth:`~stager.auth.tokens.Token.new` and
  signs it; ``revoke`` adds its id to the store behind
  :class:`~stager.auth.revocation.Revocations`.
- **Data server**: holds only the public key.  Each chunk request carries its
  capability; a :class:`~stager.auth.cache.CapabilityCache` verifies it (once per
  distinct capability string, then a dictionary look-up) and
  :func:`~stager.auth.policy.require_capability` checks its file id and operation.
  Registration and heartbeats present a token with the ``join`` scope.
- **Client**: carries its token opaquely, and the capabilities the metadata server
  hands it; :func:`~stager.auth.tokens.expires_at` tells it when to fetch fresh ones
  (it never needs the key to read that, and never trusts what it reads for access).
- **TLS** (:mod:`stager.auth.tls`): the private CA and server certificates of
  ``stager up --tls``, and the SSL contexts servers serve with and clients (and
  servers calling servers) verify with.

Layering: this package imports only :mod:`stager.errors` and :mod:`stager.protocol`
(paths), so ``web``, ``dataplane``, both servers and the client may import it.
"""

from __future__ import annotations

from .cache import CapabilityCache
from .keys import (
    KEY_FILE,
    generate_key,
    load_key,
    load_or_create_key,
    load_public_key,
    public_key_text,
)
from .policy import acts_for, allows, capability_allows, require, require_capability, visible
from .revocation import MemoryRevocations, Revocations
from .tokens import (
    CAPABILITY_TTL,
    CLOCK_SKEW,
    OPS,
    SCOPES,
    Capability,
    Claims,
    Token,
    expires_at,
    sign,
    verify,
    verify_capability,
    verify_token,
)

__all__ = [
    "CAPABILITY_TTL", "CLOCK_SKEW", "KEY_FILE", "OPS", "SCOPES",
    "Capability", "CapabilityCache", "Claims", "MemoryRevocations", "Revocations", "Token",
    "acts_for", "allows", "capability_allows", "expires_at", "generate_key", "load_key",
    "load_or_create_key", "load_public_key", "public_key_text", "require",
    "require_capability", "sign", "verify", "verify_capability", "verify_token", "visible",
]
