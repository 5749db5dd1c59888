"""Fetch groups: the units of consecutive batches fetched in one go.

Consecutive batches of a two-level shuffle read the same few blocks, so the
extents of a group's batches lie next to each other and merge into a few long
ranges (whole chunks, when the group covers a shuffle window), where each
batch alone would read scattered samples.  :class:`GroupBounds` says how large
a group may grow; :class:`FetchGroup` is the group being gathered, and knows
which of a batch's samples lie near its blocks.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .options import Prefetch
from .spans import Spans


@dataclass(frozen=True)
class GroupBounds:
    """How large a fetch group grows, from the prefetch window's bounds.

    A group's reads land in request buffers before they become samples, so for
    a moment they take twice their size: a quarter of the window at most
    (``limit``).  Past ``soft`` (the fetcher's ``bytes_in_flight``) a group takes
    only batches drawing on its own blocks (the rest of its shuffle window,
    which would otherwise be read in fragments by two groups)."""

    limit: int
    soft: int
    most_batches: int
    stream_above: int

    @classmethod
    def of(cls, prefetch: Prefetch) -> GroupBounds:
        limit = max(1, prefetch.bytes // 4)
        return cls(limit, max(1, min(prefetch.fetch.bytes_in_flight, limit)),
                   max(1, prefetch.batches * 3 // 4), prefetch.fetch.stream_above)

    def batches(self, groups: int) -> int:
        """Batches the group after ``groups`` groups holds at most: 1, 1, 2, 4, …
        up to three quarters of the window (the first batch comes soonest; past the
        start, a group usually ends where the order moves on to the next window)."""
        return min(1 << max(0, groups - 1), self.most_batches)

    def large(self, need: int, units: int) -> bool:
        """Whether ``units`` units of ``need`` bytes are large samples: read with
        striped readahead, a batch at a time, never grouped (grouping their batches
        would only make the next batch share its bandwidth)."""
        return need >= self.stream_above * max(1, units)

    def full(self, size: int, far: bool, near: np.ndarray | None) -> bool:
        """Whether a group of ``size`` bytes, with a batch ``far`` from its blocks
        (or not comparable: ``near`` is None), must be fetched before it grows."""
        return size > self.limit or (size > self.soft and (near is None or far))


@dataclass
class FetchGroup:
    """The group being gathered: its units (their keys, units and extents, one
    :class:`Spans` per batch that joined), the bytes they take, the batches that
    joined, the shuffle blocks they draw on (sorted), and the future its fetch
    resolves (unit -> its value: a group's units are distinct, as a unit used
    again within the prefetch horizon keeps its key, and a group spans fewer
    batches than that)."""

    keys: list[int] = field(default_factory=list)
    units: list[int] = field(default_factory=list)
    parts: list[Spans] = field(default_factory=list)
    need: int = 0
    batches: int = 0
    blocks: np.ndarray | None = None
    ready: asyncio.Future[dict[int, Any]] | None = None

    def join(self, keys: list[int], units: list[int], spans: Spans, need: int,
             loop: asyncio.AbstractEventLoop) -> asyncio.Future[dict[int, Any]] | None:
        """Add units to the group; returns the future their values will be in."""
        if keys:
            if self.ready is None:
                self.ready = loop.create_future()
                self.ready.add_done_callback(_retrieve)
            self.keys.extend(keys)
            self.units.extend(units)
            self.parts.append(spans)
        self.need += need
        return self.ready

    def add_blocks(self, blocks: np.ndarray, near: np.ndarray | None) -> None:
        """Record the blocks a joining batch draws on: all of them when it starts
        the group, else only its near samples' (see :meth:`near`)."""
        self.blocks = np.unique(blocks) if near is None or self.blocks is None else \
            np.union1d(self.blocks, blocks[near])

    def near(self, blocks: np.ndarray | None) -> np.ndarray | None:
        """Which of a batch's samples (given by block) lie in or right after the
        blocks the group reads from; None when there is no group to compare with.

        When most do not, the order has moved on to the next shuffle window, and a
        group spanning both windows would read half of each one's chunks, in
        fragments: the batch starts a new group.  Samples in the block right after
        one of the group's count as near, so an unshuffled order, moving from a
        block to the next, keeps its groups; only the near samples' blocks join
        the group's, so a batch straddling two windows does not pull the next
        window's blocks into it."""
        if blocks is None or self.blocks is None or not len(blocks):
            return None
        return _among(blocks, self.blocks) | _among(blocks - 1, self.blocks)

    def inside(self, blocks: np.ndarray) -> np.ndarray:
        """Which of a batch's samples lie in the group's own blocks (not the ones
        right after them: in a shuffled order those belong to another window)."""
        assert self.blocks is not None
        return _among(blocks, self.blocks)

    def spans(self) -> Spans:
        """The extents of every unit of the group, in the order of :attr:`units`."""
        return Spans.concat(self.parts)


def _among(values: np.ndarray, ordered: np.ndarray) -> np.ndarray:
    """``np.isin(values, ordered)`` for a sorted ``ordered`` (a tenth of its cost on
    a batch: this runs twice a batch on the I/O thread)."""
    if not len(ordered):
        return np.zeros(len(values), dtype=bool)
    at = np.minimum(np.searchsorted(ordered, values), len(ordered) - 1)
    return ordered[at] == values


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a unit's error as seen: the batch that needed it reports it."""
    if not future.cancelled():
        future.exception()
