"""A bounded cache of verified capabilities, for the data server's hot path.

Every chunk request carries a capability, and :func:`verify_capability`
(strict base64, an Ed25519 check, JSON) costs 0.13 ms of CPU on the shared
2-core development machine (timeit; 0.37 ms while it was busy), nearly all of
it the Ed25519 check.  The aim is auth at most 3% of read throughput: at ~400
chunk reads a second per GB/s that is 5% of a core per GB/s if every request
is verified, and far more when samples are small and requests many.  A client
reuses one capability for many requests over its lifetime, so the data server
checks each distinct capability text once and then answers from a dictionary
(0.34 µs a hit).

The key is the whole text: a cached answer is only ever for the exact bytes
that were verified, so a forged or altered text misses and is verified (and
refused) in full.  Expiry is checked again on every hit.  Refusals are not
cached: a flood of bad texts costs what it costs without a cache, and cannot
push good entries out.  The cache holds at most ``size`` entries, the least
recently used leaving first.

It is meant for one event loop (the data server's); a dictionary operation
holds the GIL, so threads sharing one would at worst verify twice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..errors import Unauthenticated
from .tokens import CLOCK_SKEW, Capability, Claims, verify_capability

DEFAULT_SIZE = 16384        # a few MB at most: texts are ~200 bytes
C = TypeVar("C", bound=Claims)


class VerifiedCache(Generic[C]):
    """``check(text, now)`` (a full verification), remembered per text.  The metadata
    server keeps bearer tokens in one (its ``check`` also asks revocation)."""

    def __init__(self, check: Callable[[str, float], C], size: int = DEFAULT_SIZE) -> None:
        if size < 1:
            raise ValueError("a verified cache holds at least one entry")
        self.check = check
        self.size = size
        self._verified: OrderedDict[str, C] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def known(self, text: str) -> bool:
        """Was ``text`` verified and kept (a hit, unless it expired since)?"""
        return text in self._verified

    def forget(self, text: str) -> None:
        self._verified.pop(text, None)

    def verify(self, text: str, now: float) -> C:
        """The claims ``text`` carries; :class:`~stager.errors.Unauthenticated`
        when it is malformed, forged, of the wrong kind or expired."""
        cap = self._verified.get(text) if isinstance(text, str) else None
        if cap is not None:
            if now > cap.expires + CLOCK_SKEW:
                self._verified.pop(text, None)
                raise Unauthenticated("expired", reason="expired")
            try:
                self._verified.move_to_end(text)
            except KeyError:            # another thread evicted it just now: still valid
                pass
            self.hits += 1
            return cap
        self.misses += 1
        cap = self.check(text, now)
        self._verified[text] = cap
        if len(self._verified) > self.size:
            self._verified.popitem(last=False)
        return cap

    def __len__(self) -> int:
        return len(self._verified)


class CapabilityCache(VerifiedCache[Capability]):
    """:func:`~stager.auth.tokens.verify_capability` with ``public``, remembered per text."""

    def __init__(self, public: Ed25519PublicKey, size: int = DEFAULT_SIZE) -> None:
        super().__init__(lambda text, now: verify_capability(public, text, now), size)
        self.public = public
