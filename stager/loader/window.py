"""The prefetch window: the batches planned ahead, the units they use and what those hold.

A unit shared by several batches (a Parquet row group, a zarr chunk row) is
fetched and decoded once and held while its uses follow each other within the
prefetch window; a use further away (another epoch, a wide shuffle) fetches it
again, so memory stays bounded whatever the order.  These runs of uses are the
*keys* the window tracks (:func:`plan_keys`): per key, the bytes it holds
against the bound and the future of the fetch group that reads it, in plain
dicts of numbers and futures (no object per unit for the garbage collector to
walk).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .options import Prefetch
from .stats import Counters

Ready = asyncio.Future[dict[int, Any]]
#: keys per batch, key -> unit, batch -> keys it uses last (see :func:`plan_keys`)
Keys = tuple[list[np.ndarray], dict[int, int], dict[int, list[int]]]


@dataclass
class PlannedBatch:
    samples: np.ndarray
    units: np.ndarray        # unit of each sample
    keys: np.ndarray         # key (unit + run of uses) of each sample


def plan_keys(units_of: Sequence[np.ndarray], horizon: int, first_key: int) -> Keys:
    """Keys of a segment's units: one per run of uses no more than ``horizon`` batches
    apart.  Returns (keys per batch, key -> unit, batch -> keys it uses last)."""
    if not units_of:
        return [], {}, {}
    lengths = [len(u) for u in units_of]
    units = np.concatenate(units_of).astype(np.int64)
    batch = np.repeat(np.arange(len(units_of), dtype=np.int64), lengths)
    order = np.lexsort((batch, units))                  # by unit, then batch
    su, sb = units[order], batch[order]
    new = np.ones(len(su), dtype=bool)
    new[1:] = (su[1:] != su[:-1]) | (sb[1:] - sb[:-1] > horizon)
    starts = np.nonzero(new)[0]
    key_sorted = np.cumsum(new) - 1 + first_key
    keys = np.empty_like(key_sorted)
    keys[order] = key_sorted
    last_batch = np.maximum.reduceat(sb, starts)
    unit_of = dict(zip(range(first_key, first_key + len(starts)), su[starts].tolist(),
                       strict=True))
    release: dict[int, list[int]] = {}
    for key, j in zip(unit_of, last_batch.tolist(), strict=True):
        release.setdefault(j, []).append(key)
    return np.split(keys, np.cumsum(lengths)[:-1]), unit_of, release


class Window:
    """Batches planned (by number, across segments) and the keys fetched for them.

    A key is held from the moment its batch is admitted until the consumer has
    taken the last batch using it; its future is dropped (set to None) as soon
    as that batch is built, so memory is the batch, not the batch twice."""

    def __init__(self, prefetch: Prefetch, counters: Counters) -> None:
        self.max_batches, self.max_bytes = prefetch.batches, prefetch.bytes
        self.counters = counters
        self.batches: dict[int, PlannedBatch] = {}
        self.consumed = 0            # batches the consumer has taken
        self.held = 0                # bytes held by the keys admitted
        self._next_key = 0
        self._release: dict[int, list[int]] = {}    # batch -> keys it uses last
        self._held_of: dict[int, int] = {}          # key -> bytes held
        self._unit_of: dict[int, int] = {}          # key -> unit, for keys planned
        self._ready: dict[int, Ready | None] = {}   # key -> its fetch group's future

    def plan(self, units_of: list[np.ndarray]) -> Keys:
        """The keys of a segment of batches (``units_of``: each one's units), numbered
        on from the last segment's: pure, so it runs off the loop (see :meth:`add`)."""
        return plan_keys(units_of, self.max_batches, self._next_key)

    def add(self, base: int, batches: list[np.ndarray], units_of: list[np.ndarray],
            keys: Keys) -> None:
        """Take in batches ``base, base + 1, …`` with their units and :meth:`plan`'s keys."""
        keys_of, unit_of, release = keys
        self._next_key += len(unit_of)
        self._unit_of.update(unit_of)
        for jj, (samples, units, ks) in enumerate(zip(batches, units_of, keys_of,
                                                     strict=True)):
            self.batches[base + jj] = PlannedBatch(samples, units, ks)
        for jj, last in release.items():
            self._release[base + jj] = last

    def new_keys(self, j: int) -> tuple[list[int], list[int], list[int]]:
        """Batch ``j``'s keys (each once), those not held yet, and their units."""
        keys = list(dict.fromkeys(self.batches[j].keys.tolist()))
        new = [k for k in keys if k not in self._held_of]
        return keys, new, [self._unit_of[k] for k in new]

    def must_wait(self, j: int, need: int, batches: int) -> bool:
        """Whether batch ``j`` (with room for ``batches`` from it) must wait for the consumer."""
        return j > self.consumed and (
            j + batches - 1 - self.consumed >= self.max_batches
            or self.held + need > self.max_bytes)

    def hold(self, keys: list[int], sizes: list[int], ready: Ready | None) -> None:
        """Hold ``keys`` (of ``sizes`` bytes), to be read by the fetch of ``ready``."""
        self._held_of.update(zip(keys, sizes, strict=True))
        self._ready.update(dict.fromkeys(keys, ready))
        self.held += sum(sizes)
        self.counters.note_held(self.held)

    def resize(self, keys: list[int], sizes: list[int]) -> None:
        """The keys' units were decoded: they hold ``sizes`` bytes now."""
        for k, size in zip(keys, sizes, strict=True):
            held = self._held_of.get(k)
            if held is not None:
                self.held += size - held
                self._held_of[k] = size
        self.counters.note_held(self.held)

    def futures(self, keys: list[int]) -> tuple[list[int], list[Ready | None]]:
        """The units of ``keys`` and the futures their values come in."""
        return [self._unit_of[k] for k in keys], [self._ready[k] for k in keys]

    def built(self, j: int) -> None:
        """Batch ``j`` holds what it needs now: drop the futures of the keys it
        used last (their bytes stay counted until the consumer takes it)."""
        for k in self._release.get(j, ()):
            if k in self._ready:
                self._ready[k] = None

    def consumed_upto(self, n: int) -> None:
        """The consumer has taken batches ``0 … n-1``: release what they held."""
        for j in range(self.consumed, n):
            self.batches.pop(j, None)
            for k in self._release.pop(j, ()):
                self.held -= self._held_of.pop(k, 0)
                self._ready.pop(k, None)
                self._unit_of.pop(k, None)
        self.consumed = max(self.consumed, n)

    def clear(self) -> None:
        self._held_of.clear()
        self._ready.clear()
        self.batches.clear()
        self.held = 0
