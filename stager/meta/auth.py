"""The metadata server's authority: its signing key, the tokens it minted, revocation.

With ``--auth`` the metadata server holds the cluster's Ed25519 key (under
``ROOT/auth/``).  It is the only process that can mint anything:

- **tokens**, for users, teams and data servers (``stager token create``): each
  recorded in the store without its text, revocable at once (the revoked ids are
  a set in memory, filled from the store at start and on every revocation, and
  every :data:`REVOKED_REFRESH` seconds where other metadata servers share the
  store);
- **capabilities**, one per file id and operation, handed out with layouts, and
  one per batch of files from the ``capabilities`` route (a Loader's plan), and
  its own **server capabilities** for what it asks of data servers (rebuild
  copies, purges, scrubs, listings, the gateway's reads): every file, one operation, one target;
- **target credentials**: one per storage target, minted at its first registration
  (:meth:`MetaAuth.mint_target_credential`), pinned to the target in the store
  (stager/meta/targetauth.py).

Verifying a bearer token costs an Ed25519 check (~0.13 ms); a client sends the
same text with every request, so verified texts are remembered
(:class:`~stager.auth.cache.VerifiedCache`), with revocation and expiry asked
again on every hit.  Minted capabilities are remembered too, and reused while
more than half their life is left, so a file stat'ed a thousand times is signed
once per five minutes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..auth import (
    CAPABILITY_TTL,
    Capability,
    Token,
    load_or_create_key,
    public_key_text,
    sign,
    verify_token,
)
from ..auth.cache import VerifiedCache
from ..auth.keys import write_secret
from ..auth.tokens import ANY_FILE, MAX_BATCH_FILES
from ..bounded import Bounded
from ..protocol.authmsg import TokenInfo, TokenRequest
from .store.base import TokenStore

AUTH_DIR = "auth"
ADMIN_TOKEN_FILE = "admin.token"
ADMIN_TTL = 10 * 365 * 86400        # the bootstrap admin token: revoke it to end it
MINTED_CACHE = 65536                # capabilities remembered for reuse
SELF_ID = "0" * 32                  # the holder of the server capabilities: this server
TARGET_CREDENTIAL_TTL = 10 * 365 * 86400    # revoked, not expired: `stager token revoke`
REVOKED_REFRESH = 0.5               # seconds between reads of the revoked ids (shared store)


class MetaAuth:
    """The key, the token registry and the capability mint of one metadata server."""

    def __init__(self, key: Ed25519PrivateKey, store: TokenStore,
                 clock: Callable[[], float] = time.time,
                 capability_ttl: float = CAPABILITY_TTL) -> None:
        self.key = key
        self.capability_ttl = capability_ttl
        self.public = key.public_key()
        self.public_text = public_key_text(key)
        self.store = store
        self.clock = clock
        self.revoked: set[str] = set()
        self.tokens = VerifiedCache(lambda text, now: verify_token(self.public, text, now, self))
        self._minted: Bounded[tuple[str, str, str, str | None], tuple[str, int]] = \
            Bounded(MINTED_CACHE)

    @classmethod
    def under(cls, directory: Path | str, store: TokenStore,
              capability_ttl: float = CAPABILITY_TTL) -> MetaAuth:
        """The authority whose key is in ``directory`` (made there the first time)."""
        return cls(load_or_create_key(directory), store, capability_ttl=capability_ttl)

    async def start(self) -> None:
        await self.refresh()

    async def refresh(self) -> None:
        """Read the revoked ids from the store: at start, and often where other
        metadata servers share it (a revoke through one is refused by all)."""
        self.revoked = {t.id for t in await self.store.list_tokens() if t.revoked is not None}

    # -- bearer tokens ----------------------------------------------------------------
    def is_revoked(self, token_id: str) -> bool:
        return token_id in self.revoked

    def authenticate(self, text: str) -> Token:
        """The token ``text`` carries; :class:`~stager.errors.Unauthenticated` when it
        is malformed, forged, expired, revoked or a capability."""
        token = self.tokens.verify(text, self.clock())
        assert isinstance(token, Token)
        if token.id in self.revoked:         # revoked after it was remembered
            self.tokens.forget(text)
            verify_token(self.public, text, self.clock(), self)
        return token

    async def mint(self, request: TokenRequest) -> tuple[str, TokenInfo]:
        """A new token and its record (stored before the text is returned)."""
        now = self.clock()
        token = Token.new(request.name, set(request.scopes), list(request.prefixes),
                          request.ttl, now)
        info = TokenInfo(token.id, token.name, tuple(sorted(token.scopes)), token.prefixes,
                         int(now), token.expires, uses=request.uses)
        await self.store.put_token(info)
        return sign(self.key, token), info

    async def mint_target_credential(self, target_id: str) -> tuple[str, TokenInfo]:
        """A new credential for ``target_id`` alone (scope ``target``), recorded like
        any token (``stager token list`` shows it as ``target:ID``; revocable)."""
        now = self.clock()
        token = Token.new(f"target:{target_id}", {"target"}, ["/"], TARGET_CREDENTIAL_TTL,
                          now, target=target_id)
        info = TokenInfo(token.id, token.name, ("target",), token.prefixes, int(now),
                         token.expires)
        await self.store.put_token(info)
        return sign(self.key, token), info

    async def revoke(self, token_id: str) -> TokenInfo:
        info = await self.store.revoke_token(token_id, now=int(self.clock()))
        self.revoked.add(token_id)
        return info

    async def list(self) -> list[TokenInfo]:
        return await self.store.list_tokens()

    # -- capabilities -------------------------------------------------------------------
    def capability(self, file_id: str, op: str, holder: str,
                   target: str | None = None) -> str:
        """A capability for ``op`` on ``file_id``, for the token ``holder`` (on
        ``target`` alone, for this server's own); one minted earlier is reused while
        more than half its life is left."""
        now = self.clock()
        key = (file_id, op, holder, target)
        hit = self._minted.get(key)
        if hit is not None and hit[1] - now > self.capability_ttl / 2:
            return hit[0]
        cap = Capability(file_id, op, int(now + self.capability_ttl), holder, target)
        text = sign(self.key, cap)
        self._minted.put(key, (text, cap.expires))
        return text

    def capabilities(self, file_ids: Sequence[str], op: str, holder: str) -> list[str]:
        """A capability for ``op`` on each of ``file_ids``, for the token ``holder``: one
        batch capability per :data:`MAX_BATCH_FILES` of them, in their order, so a plan
        of many small files is signed (and verified by each data server) once a batch,
        not once a file.  A lone file gets its own, reused like :meth:`capability`'s."""
        out: list[str] = []
        for start in range(0, len(file_ids), MAX_BATCH_FILES):
            part = file_ids[start:start + MAX_BATCH_FILES]
            if len(set(part)) == 1:
                out += [self.capability(part[0], op, holder)] * len(part)
                continue
            cap = Capability.batch(part, op, holder, self.clock(), self.capability_ttl)
            out += [sign(self.key, cap)] * len(part)
        return out

    def server_capability(self, op: str, target: str) -> str:
        """This server's own capability for ``op`` ("read", "write" or "cluster": the
        maintenance routes) on every file of ``target``, and on no other target."""
        return self.capability(ANY_FILE, op, SELF_ID, target)

    async def write_admin_token(self, path: Path | str) -> Path | None:
        """Mint an admin token into ``path`` (0600) unless a file is there."""
        path = Path(path)
        if path.exists():
            return None
        text, _ = await self.mint(TokenRequest(("admin",), ("/",), ADMIN_TTL, "admin"))
        write_secret(path, text + "\n")
        return path
