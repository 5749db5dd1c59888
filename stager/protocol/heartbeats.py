"""Batched heartbeats on the wire: one request for every target a data server process holds.

A heartbeat costs the metadata server about a quarter of a millisecond of CPU, nearly
all of it the request (HTTP, JSON, the token check), not the beat: at a thousand nodes
of eight targets every two seconds that is most of a core.  So a process that serves
several targets sends one ``POST /v1/heartbeats`` for all of them every interval; the
per-target route (``POST /v1/targets/{id}/heartbeat``) stays for older data servers.

A batch speaks only for targets it can prove: each item names its target and carries
that target's own credential (``credential``, the text the target was handed at its
first registration); an item without one is proven by the request's bearer token
alone (the sender's own target, or an admin token).  With auth off there is nothing to
prove.  The answer is per item (:func:`~stager.protocol.batch.results_json`): ``null``
for a beat taken, or its error — 404 for a target the server does not know (register
again), 401 for a credential refused (revoked: join again) — and the other items go
ahead; a credential that is another target's refuses the whole batch (403).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import BadRequest
from .messages import Heartbeat
from .models import TARGET_ID_RE, field_of

MAX_CREDENTIAL = 4096       # characters of a target credential's text (they are ~300)


@dataclass(frozen=True)
class BeatItem:
    """One target's heartbeat in a batch, with the credential that proves it."""

    target_id: str
    beat: Heartbeat
    credential: str | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"target_id": self.target_id, "heartbeat": self.beat.to_json()}
        return body if self.credential is None else {**body, "credential": self.credential}

    @classmethod
    def from_json(cls, obj: Any) -> BeatItem:
        target_id = field_of(obj, "target_id", str)
        if not TARGET_ID_RE.match(target_id):
            raise BadRequest(f"invalid target id {target_id[:80]!r}")
        credential = field_of(obj, "credential", str, None)
        if credential is not None and not 0 < len(credential) <= MAX_CREDENTIAL:
            raise BadRequest(f"a credential is 1 to {MAX_CREDENTIAL} characters")
        return cls(target_id, Heartbeat.from_json(field_of(obj, "heartbeat", dict)),
                   credential)
