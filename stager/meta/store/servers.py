"""The store's roles that serve several metadata servers at once: their shared soft
state and duties (:class:`SharedState`) and the answers recorded for idempotency keys
(:class:`Answers`); :class:`~.base.MetaStore` joins them with the others."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any


class SharedState(ABC):
    """What several metadata servers on one store share (:mod:`stager.meta.shared`)."""

    #: Whether other metadata servers may use this store at the same time (then the
    #: soft state below is read back from it, and the duties go by :meth:`hold_duties`).
    shared: bool = False

    @abstractmethod
    async def put_state(self, key: str, value: dict[str, Any] | None) -> None:
        """Store a small JSON document under ``key`` (``None``: forget it): the
        servers' shared soft state (suspects, rebuild progress, the last fsck)."""

    @abstractmethod
    async def get_states(self, prefix: str) -> dict[str, dict[str, Any]]:
        """Every document whose key starts with ``prefix``, by key."""

    @abstractmethod
    async def put_report(self, key: str, body: dict[str, Any], *, expires: float) -> None:
        """Store a loader's last telemetry report (:mod:`.jobtable`) under ``key``,
        replacing its previous one, until ``expires`` (need not survive a crash)."""

    async def put_reports(self, reports: Sequence[tuple[str, dict[str, Any], float]]) -> None:
        """Store many ``(key, body, expires)`` reports as :meth:`put_report` stores one
        (a key named twice: its last); a shared store takes them in one transaction."""
        for key, body, expires in reports:
            await self.put_report(key, body, expires=expires)

    @abstractmethod
    async def live_reports(self, now: float) -> dict[str, dict[str, Any]]:
        """Every report not expired at ``now``, by key (the expired ones are dropped)."""

    @abstractmethod
    async def hold_duties(self) -> bool:
        """Whether this server runs the background duties (garbage collection,
        rebuild, fsck) now: takes them when no other server holds them.  A store only
        one server uses always says yes; PostgreSQL says yes to the one server that
        holds an advisory lock, and another takes it when that one dies."""


class Answers(ABC):
    """Recorded answers to requests sent with an idempotency key
    (:mod:`stager.web.idempotency`)."""

    @abstractmethod
    async def recorded_answer(self, key: str) -> tuple[int, bytes] | None:
        """The ``(status, body)`` recorded for the idempotency ``key``, or ``None``."""

    @abstractmethod
    async def record_answer(self, key: str, status: int, body: bytes, *, now: float) -> bool:
        """Record the answer to the request sent with ``key`` at ``now``; False (and the
        first kept) when ``key`` already has one."""

    @abstractmethod
    async def expire_answers(self, before: float) -> int:
        """Forget answers recorded before ``before``; how many went."""
