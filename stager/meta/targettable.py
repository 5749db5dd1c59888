"""The targets a metadata server knows, by id, and the oldest heartbeat among them.

:meth:`MetaService.refresh_health <stager.meta.service.MetaService.refresh_health>`
runs before every placement and listing of targets; at 4,000 targets its scan held
the event loop ~1.8 ms about once a second under heartbeat load (bench.profile_holds).
No target can have gone stale while the oldest heartbeat of a placeable one is within
``target_timeout``, so the table keeps that oldest time as targets are set, and the
scan runs only once it may find something.
"""

from __future__ import annotations

import math

from ..layout import PLACEABLE
from ..protocol.models import TargetInfo


class TargetTable(dict[str, TargetInfo]):
    """A dict of targets by id.  Every assignment (``table[id] = target``, the only way
    the service sets one) keeps :attr:`oldest` at or below the oldest heartbeat of a
    placeable target; a target in state ``suspect`` makes it minus infinity, since its
    return to ``up`` depends on the clock, not on a heartbeat."""

    def __init__(self) -> None:
        super().__init__()
        self.oldest = math.inf

    def __setitem__(self, target_id: str, target: TargetInfo) -> None:
        super().__setitem__(target_id, target)
        self._note(target)

    def _note(self, target: TargetInfo) -> None:
        if target.state == "suspect":
            self.oldest = -math.inf
        elif target.state in PLACEABLE:
            self.oldest = min(self.oldest, target.last_heartbeat)

    def may_be_stale(self, now: float, timeout: float) -> bool:
        """Whether a scan could find a target to mark down (or a suspect to clear)."""
        return now - self.oldest > timeout

    def scanned(self) -> None:
        """A scan has marked what it found: :attr:`oldest` becomes exact again."""
        self.oldest = math.inf
        for target in self.values():
            self._note(target)
