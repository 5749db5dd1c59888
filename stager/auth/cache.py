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
push good entries out.  The cache holds at most ``size`` entries and
``max_bytes`` characters of text, the least recently used leaving first: a batch
capability (up to 256 files) is ~7.6 KB of text and a set of its files, so a count
alone would let 16,384 of them take hundreds of MB.

A capability cache also names each text it verified by its reference
(:mod:`stager.auth.refs`), so that a request may show ``ref1.<id>`` for a text
this server verified and still keeps; the id leaves with its text, and a hit
through it is checked as a hit through the text (expiry here, the claims by the
gate).

It is meant for one event loop (the data server's); a dictionary operation
holds the GIL, so threads sharing one would at worst verify twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..bounded import Bounded
from ..errors import Unauthenticated
from .refs import PREFIX, UNKNOWN, reference
from .tokens import CLOCK_SKEW, Capability, Claims, verify_capability

DEFAULT_SIZE = 16384        # a few MB at most: a file capability's text is ~200 bytes
DEFAULT_BYTES = 16 << 20    # of texts: ~2,000 batch capabilities (~500,000 files)
C = TypeVar("C", bound=Claims)


class VerifiedCache(Generic[C]):
    """``check(text, now)`` (a full verification), remembered per text.  The metadata
    server keeps bearer tokens in one (its ``check`` also asks revocation)."""

    def __init__(self, check: Callable[[str, float], C], size: int = DEFAULT_SIZE,
                 max_bytes: int = DEFAULT_BYTES, refs: bool = False) -> None:
        if size < 1:
            raise ValueError("a verified cache holds at least one entry")
        self.check = check
        self.size, self.max_bytes = size, max_bytes
        self._verified: Bounded[str, C] = Bounded(size, on_evict=self._evicted)
        # reference → text, for the texts held (only when ``refs``: a data server's)
        self._refs: dict[str, str] | None = {} if refs else None
        self._ref_of: dict[str, str] = {}       # text → its reference, the same entries
        self._bytes = 0             # characters of the texts held
        self.hits = 0
        self.misses = 0

    def known(self, text: str) -> bool:
        """Was ``text`` (or the text a reference names) verified and kept (a hit,
        unless it expired since)?"""
        if self._refs is not None and text.startswith(PREFIX):
            return True         # resolved or refused at once: never a verification
        return text in self._verified

    def forget(self, text: str) -> None:
        if self._verified.pop(text, None) is not None:
            self._evicted(text, None)

    def _evicted(self, text: str, _: object) -> None:
        """``text`` left: its characters and its reference with it."""
        self._bytes -= len(text)
        if self._refs is not None:
            ref = self._ref_of.pop(text, None)
            if ref is not None:
                self._refs.pop(ref, None)

    def item(self, text: str, now: float) -> C:
        """:meth:`verify` for one item of a request: a text, or (with ``refs``) the
        reference of a text this cache verified and holds; any other reference is
        :class:`~stager.errors.Unauthenticated` with reason ``unknown_reference``."""
        if self._refs is not None and text.startswith(PREFIX):
            held = self._refs.get(text)
            if held is None:
                raise Unauthenticated("this data server holds no capability by that "
                                      "reference (send its text)", reason=UNKNOWN)
            text = held
        return self.verify(text, now)

    def verify(self, text: str, now: float) -> C:
        """The claims ``text`` carries; :class:`~stager.errors.Unauthenticated`
        when it is malformed, forged, of the wrong kind or expired."""
        cap = self._verified.get(text) if isinstance(text, str) else None
        if cap is not None:
            if now > cap.expires + CLOCK_SKEW:
                self.forget(text)
                raise Unauthenticated("expired", reason="expired")
            try:
                self._verified.move_to_end(text)
            except KeyError:            # another thread evicted it just now: still valid
                pass
            self.hits += 1
            return cap
        self.misses += 1
        cap = self.check(text, now)
        if text not in self._verified:
            self._bytes += len(text)
            if self._refs is not None:      # named only once verified, by this server
                ref = self._ref_of[text] = reference(text)
                self._refs[ref] = text
        self._verified.put(text, cap)          # past ``size``, the oldest leave
        while self._bytes > self.max_bytes and len(self._verified) > 1:
            self._verified.evict()
        return cap

    def __len__(self) -> int:
        return len(self._verified)


class CapabilityCache(VerifiedCache[Capability]):
    """:func:`~stager.auth.tokens.verify_capability` with ``public``, remembered per text
    and per reference."""

    def __init__(self, public: Ed25519PublicKey, size: int = DEFAULT_SIZE,
                 max_bytes: int = DEFAULT_BYTES) -> None:
        super().__init__(lambda text, now: verify_capability(public, text, now), size,
                         max_bytes, refs=True)
        self.public = public
