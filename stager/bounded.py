"""A mapping that keeps at most ``limit`` entries, the oldest leaving first.

Many parts keep a memo of recent answers (verified tokens, minted capabilities,
layout hints, per-token clients) and bound it the same way: an ordered dictionary,
the newest entry at the end, the first one out past a limit.  :class:`Bounded` is
that, once.

It is a plain :class:`~collections.OrderedDict`: a lookup, ``in``, ``get``,
``pop`` and ``move_to_end`` are the C dictionary's, with no Python call in
between, so a hot path (a data server's capability check, a Loader's small-file
reads) costs what it did by hand.  Only :meth:`put` and :meth:`trim` are Python.
Which order the entries leave in is the caller's: :meth:`put` makes an entry the
newest; a least-recently-used memo also calls ``move_to_end(key)`` on a hit, an
insertion-ordered one does not (and a plain ``self[key] = value`` leaves a key
already there where it was).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Bounded(OrderedDict[K, V]):
    """At most ``limit`` entries once trimmed; ``on_evict(key, value)`` is called for
    each entry :meth:`trim` or :meth:`evict` puts out (not for a ``pop`` or ``del``:
    the caller that removes an entry itself knows)."""

    def __init__(self, limit: int,
                 on_evict: Callable[[K, V], object] | None = None) -> None:
        if limit < 1:
            raise ValueError("a bounded mapping holds at least one entry")
        super().__init__()
        self.limit = limit
        self.on_evict = on_evict

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` under ``key`` as the newest entry, then :meth:`trim`."""
        self[key] = value
        self.move_to_end(key)
        if len(self) > self.limit:
            self.trim()

    def trim(self) -> None:
        """Put the oldest entries out until at most :attr:`limit` are left (after a
        batch of plain ``self[key] = value``, say)."""
        while len(self) > self.limit:
            self.evict()

    def evict(self) -> tuple[K, V]:
        """Put the oldest entry out (``KeyError`` when empty) and return it: for a
        caller with a bound of its own besides the count (bytes, age)."""
        key, value = self.popitem(last=False)
        if self.on_evict is not None:
            self.on_evict(key, value)
        return key, value
