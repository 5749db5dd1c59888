"""Which token ids are revoked: the interface the metadata server's store will fill.

``stager token revoke ID`` must take effect at once, so the metadata server
asks on every request; :class:`Revocations` is the one question it asks.  The
store-backed implementation (a table next to the namespace, cached in memory,
so the question stays a set look-up) comes with the server wiring;
:class:`MemoryRevocations` serves tests and a store-less server.

Capabilities are not revocable: they live :data:`~stager.auth.tokens.CAPABILITY_TTL`
seconds, and revoking a token stops new ones being issued to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable


@runtime_checkable
class Revocations(Protocol):
    def is_revoked(self, token_id: str) -> bool:
        """True once ``token_id`` has been revoked; must be cheap (asked per request)."""
        ...


class MemoryRevocations:
    """Revoked ids in a set, for tests."""

    def __init__(self, ids: Iterable[str] = ()) -> None:
        self._ids = set(ids)

    def revoke(self, token_id: str) -> None:
        self._ids.add(token_id)

    def is_revoked(self, token_id: str) -> bool:
        return token_id in self._ids
