"""Suspicion that fits the facts: which targets new layouts avoid, and for how long.

A target that heartbeats is *up*.  One that a writer could not store chunks on
may be dead before its heartbeats stop, so new layouts should avoid it; but a
report is one writer's view, a killed server is often back (restarted) within a
second, and a suspicion that outlives the facts stops writes for everyone.  So:

* **A report is checked.**  A writer's report (route ``reroute``) moves that
  writer's upload off the target at once (:mod:`.reroute`); the target turns
  *suspect* for everyone only when the metadata server's own probe of it fails
  too: ``GET /v1/health`` within :data:`PROBE_TIMEOUT`, answered with the
  target's id.  One probe per target is in flight at a time, however many
  writers report it; every report waits on that one.  A report with no upload
  in it marks nothing.
* **A suspicion belongs to one incarnation.**  A data server registers with a
  boot id made when its process starts (``TargetInfo.boot``); a registration
  with another one drops the suspicion, and a ``leave``, at once: the restarted
  server is up again.  A data server that sends no boot id is a new incarnation
  at each registration (:func:`incarnation`).
* **Suspect is avoided, never excluded** from a layout that needs it: layouts
  take the up targets first and suspect ones only to reach ``replicas`` nodes
  (:func:`stager.layout.choose_layout`, :func:`.reroute.replacement`), so a
  write fails only when fewer nodes than that answer.  A suspect one counts as
  answering once it has heartbeat since it was suspected
  (:meth:`Suspicion.heard_since`): one that has not is most likely dead, and a
  layout on it would only fail again.

A suspicion lasts ``target_timeout`` seconds.  On a store several metadata
servers share, suspicions (``suspect/ID``: until, boot) and boot ids
(``boot/ID``) are stored, and every server applies the same rules to what it
reads back (:mod:`.shared`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..auth.tls import client_ssl
from ..errors import TRANSPORT_FAILURES
from ..protocol.models import TargetInfo
from ..protocol.routes import route

log = logging.getLogger("stager.meta")
PROBE_TIMEOUT = 1.0     # seconds a reported target has to answer the metadata server

# Whether a target answers as itself (the metadata server's own look at it).
Ask = Callable[[TargetInfo], Awaitable[bool]]


@dataclass(frozen=True)
class Suspicion:
    """New layouts avoid incarnation ``boot`` of a target from clock time ``since``
    until ``until``."""

    until: float
    boot: str
    since: float = 0.0

    def holds(self, target: TargetInfo, now: float) -> bool:
        """Whether it still applies to ``target`` as registered now."""
        return self.until > now and self.boot == target.boot

    def heard_since(self, target: TargetInfo) -> bool:
        """Whether ``target`` heartbeat after it was suspected: alive, so a layout that
        cannot do without it may take it."""
        return target.last_heartbeat > self.since

    def to_json(self) -> dict[str, Any]:
        return {"until": self.until, "boot": self.boot, "since": self.since}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Suspicion:
        return cls(float(body.get("until", 0.0)), str(body.get("boot", "")),
                   float(body.get("since", 0.0)))


def incarnation(target: TargetInfo, now: float) -> str:
    """The boot id a registration stands for: the data server's, else (a server that
    sends none) the registration's time, so that every registration is a new one."""
    return target.boot or f"registered@{now:.6f}"


def merged(suspicions: list[Suspicion | None], boot: str) -> Suspicion | None:
    """The longest of ``suspicions`` of incarnation ``boot``; ``None`` when none is."""
    mine = [s for s in suspicions if s is not None and s.boot == boot]
    return max(mine, key=lambda s: s.until, default=None)


class Probes:
    """At most one probe in flight per target: a report that comes while one is
    asked waits for that one's answer.  ``on_answer(target, answered)`` runs once per
    probe, whoever waits (a waiter that gives up cancels nothing)."""

    def __init__(self, ask: Ask, on_answer: Callable[[TargetInfo, bool], Awaitable[None]]
                 ) -> None:
        self.ask = ask
        self.on_answer = on_answer
        self.in_flight: dict[str, asyncio.Future[bool]] = {}

    async def answers(self, target: TargetInfo) -> bool:
        probe = self.in_flight.get(target.id)
        if probe is None:
            probe = asyncio.ensure_future(self._probe(target))
            self.in_flight[target.id] = probe
            probe.add_done_callback(lambda _: self.in_flight.pop(target.id, None))
        return await asyncio.shield(probe)

    async def _probe(self, target: TargetInfo) -> bool:
        try:
            answered = await self.ask(target)
        except Exception:           # a probe that broke says nothing against the target
            log.exception("probing target %s failed", target.id)
            return True
        await self.on_answer(target, answered)
        return answered


def asker(ca_file: str, timeout: float = PROBE_TIMEOUT) -> Ask:
    """Ask a target ``GET /v1/health`` over a connection of its own, trusting
    ``ca_file`` (a TLS cluster's CA): whether it answered 200 with its own id within
    ``timeout`` seconds."""
    async def ask(target: TargetInfo) -> bool:
        connector = aiohttp.TCPConnector(ssl=client_ssl(ca_file))
        try:
            async with aiohttp.ClientSession(
                    connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as session, session.get(route("health").url(target.url)) as resp:
                answer = json.loads(await resp.read()) if resp.status == 200 else None
        except (*TRANSPORT_FAILURES, ValueError) as exc:
            log.info("target %s did not answer its health probe: %s", target.id,
                     type(exc).__name__ if isinstance(exc, TimeoutError) else exc)
            return False
        return isinstance(answer, dict) and answer.get("id") == target.id

    return ask
