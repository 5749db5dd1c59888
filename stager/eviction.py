"""Cache eviction: named policies over an explicit state, and a trace simulator.

Every policy is a factory registered in :data:`EVICTION` by name,
``EVICTION[name](capacity, next_use) -> Eviction``, and the state it returns
answers four calls (there is no clock: ``now`` is the caller's access count):

- ``admit(key, size, now)``: a missed key was fetched and is now cached;
- ``hit(key, now)``: a cached key was read;
- ``victims(need, now, pinned)``: the cached keys to drop to free ``need``
  bytes (fewer when only pinned keys are left), which the policy forgets;
- ``forget(key)``: the key left the cache some other way (a refresh, a detach).

A key is any hashable, orderable value (a chunk id, a ``(file, chunk)`` tuple).
``lru`` and ``s3fifo`` look only at the past.  ``plan`` looks at the future:
it drops the key whose next use is furthest away (never used again first),
asking ``next_use(key, now)`` for the position of the key's first use after
``now`` (``inf`` for none) — a :class:`Uses` table built from the Loaders'
registered epoch plans (:func:`stager.plans.accesses.plan_accesses`).
``belady`` is the same rule fed with a recorded trace's own table
(``Uses(trace)``): the offline optimum the others are measured against.

Why the future wins: for a known sequence and equal sizes, furthest next use
is optimal (Belady 1966; a cached key used sooner can always take the place of
one used later without losing a hit).  A training job's epochs are such a
sequence, and the one access pattern where LRU is worst: a shuffled pass over
a dataset larger than the cache evicts each chunk just before the next epoch
wants it, and a cyclic pass over ``capacity + 1`` chunks never hits at all,
where furthest-next-use keeps ``capacity - 1`` of them.  With unequal sizes
furthest-next-use is no longer exactly optimal, but stays the rule to beat.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .policies import Registry

#: (key, now) -> position of the key's first use after ``now``, ``math.inf`` if none
NextUse = Callable[[Any, int], float]


class Eviction(Protocol):
    """One cache's eviction state (see the module docstring)."""

    def admit(self, key: Any, size: int, now: int) -> None: ...

    def hit(self, key: Any, now: int) -> None: ...

    def victims(self, need: int, now: int, pinned: Container[Any]) -> list[Any]: ...

    def forget(self, key: Any) -> None: ...


#: (capacity in bytes, next_use or None) -> a fresh, empty state
EvictionPolicy = Callable[[int, NextUse | None], Eviction]
EVICTION: Registry[EvictionPolicy] = Registry("eviction")
eviction_policy = EVICTION.register


# -- the past ----------------------------------------------------------------------------
class Lru:
    """Least recently used first."""

    def __init__(self) -> None:
        self._keys: OrderedDict[Any, int] = OrderedDict()      # oldest first -> size

    def admit(self, key: Any, size: int, now: int) -> None:
        self._keys[key] = size
        self._keys.move_to_end(key)

    def hit(self, key: Any, now: int) -> None:
        if key in self._keys:       # a key that left by another way is no hit (forget)
            self._keys.move_to_end(key)

    def victims(self, need: int, now: int, pinned: Container[Any]) -> list[Any]:
        out: list[Any] = []
        skipped: list[Any] = []
        freed = 0
        for key, size in self._keys.items():
            if freed >= need:
                break
            if key in pinned:
                skipped.append(key)
            else:
                out.append(key)
                freed += size
        for key in out:
            del self._keys[key]
        for key in skipped:     # a pin is never a victim: out of the way of the next scan
            self._keys.move_to_end(key)
        return out

    def forget(self, key: Any) -> None:
        self._keys.pop(key, None)


class S3Fifo:
    """S3-FIFO (Yang et al., SOSP'23): a small FIFO of 10% of the bytes takes new
    keys; one read again before it leaves the small queue moves it to the main
    FIFO, else it leaves a ghost behind, and a ghost that comes back enters the
    main queue directly.  The main queue gives each key up to three more laps
    (one per read, at most 3).  One-hit wonders so leave after a short stay
    without pushing out the keys that are read again."""

    def __init__(self, capacity: int, small: float = 0.1) -> None:
        self._small_limit = small * capacity
        self._ghost_limit = capacity - self._small_limit
        self._small: OrderedDict[Any, int] = OrderedDict()     # oldest first -> size
        self._main: OrderedDict[Any, int] = OrderedDict()
        self._ghost: OrderedDict[Any, int] = OrderedDict()
        self._small_bytes = self._ghost_bytes = 0
        self._freq: dict[Any, int] = {}

    def admit(self, key: Any, size: int, now: int) -> None:
        self._freq[key] = 0
        if key in self._ghost:
            self._ghost_bytes -= self._ghost.pop(key)
            self._main[key] = size
        else:
            self._small[key] = size
            self._small_bytes += size

    def hit(self, key: Any, now: int) -> None:
        self._freq[key] = min(3, self._freq.get(key, 0) + 1)

    def victims(self, need: int, now: int, pinned: Container[Any]) -> list[Any]:
        out: list[Any] = []
        freed = 0
        while freed < need:
            first, second = ((self._evict_small, self._evict_main)
                             if self._small_bytes >= self._small_limit or not self._main
                             else (self._evict_main, self._evict_small))
            victim = first(pinned)
            if victim is None:
                victim = second(pinned)
            if victim is None:
                break
            key, size = victim
            out.append(key)
            freed += size
        return out

    def _evict_small(self, pinned: Container[Any]) -> tuple[Any, int] | None:
        while self._small:
            key, size = self._small.popitem(last=False)
            self._small_bytes -= size
            if self._freq[key] > 0 or key in pinned:
                self._main[key] = size                # read again: it stays, in main
                continue
            del self._freq[key]
            self._ghost[key] = size
            self._ghost_bytes += size
            while self._ghost_bytes > self._ghost_limit:
                self._ghost_bytes -= self._ghost.popitem(last=False)[1]
            return key, size
        return None

    def _evict_main(self, pinned: Container[Any]) -> tuple[Any, int] | None:
        # each unpinned key goes within four laps (its count is at most 3)
        for _ in range(4 * len(self._main) + 1):
            if not self._main:
                break
            key, size = self._main.popitem(last=False)
            if key in pinned or self._freq[key] > 0:
                if key not in pinned:
                    self._freq[key] -= 1
                self._main[key] = size
                continue
            del self._freq[key]
            return key, size
        return None

    def forget(self, key: Any) -> None:
        if key in self._small:
            self._small_bytes -= self._small.pop(key)
        self._main.pop(key, None)
        self._freq.pop(key, None)


# -- the future --------------------------------------------------------------------------
class FurthestNextUse:
    """Drops the key whose next use is furthest (never used again first; among
    equals the smallest key), from a max-heap of next uses.  A key's next use is
    looked up when it is admitted or read, and stays right until it is read
    again, so stale heap entries are merely skipped."""

    def __init__(self, next_use: NextUse) -> None:
        self._next_use = next_use
        self._sizes: dict[Any, int] = {}
        self._next: dict[Any, float] = {}
        self._heap: list[tuple[float, Any]] = []       # (-next use, key)

    def admit(self, key: Any, size: int, now: int) -> None:
        self._sizes[key] = size
        self._note(key, now)

    def hit(self, key: Any, now: int) -> None:
        self._note(key, now)

    def _note(self, key: Any, now: int) -> None:
        nxt = float(self._next_use(key, now))
        self._next[key] = nxt
        heapq.heappush(self._heap, (-nxt, key))
        if len(self._heap) > 4 * len(self._next) + 64:     # drop the stale entries
            self._heap = [(-n, k) for k, n in self._next.items()]
            heapq.heapify(self._heap)

    def victims(self, need: int, now: int, pinned: Container[Any]) -> list[Any]:
        out: list[Any] = []
        kept: list[tuple[float, Any]] = []
        freed = 0
        while freed < need and self._heap:
            entry = heapq.heappop(self._heap)
            neg, key = entry
            if self._next.get(key) != -neg:
                continue                                 # stale: read again since
            if key in pinned:
                kept.append(entry)
                continue
            del self._next[key]
            freed += self._sizes.pop(key)
            out.append(key)
        for entry in kept:
            heapq.heappush(self._heap, entry)
        return out

    def forget(self, key: Any) -> None:
        self._next.pop(key, None)
        self._sizes.pop(key, None)


@eviction_policy("lru")
def lru(capacity: int, next_use: NextUse | None = None) -> Eviction:
    """Least recently used: the fallback that churns on cyclic epochs."""
    return Lru()


@eviction_policy("s3fifo")
def s3fifo(capacity: int, next_use: NextUse | None = None) -> Eviction:
    """S3-FIFO: quick demotion of keys read once (see :class:`S3Fifo`)."""
    return S3Fifo(capacity)


@eviction_policy("plan")
def plan(capacity: int, next_use: NextUse | None = None) -> Eviction:
    """Furthest next use by the registered epoch plans (``next_use`` from them)."""
    if next_use is None:
        raise ValueError("eviction policy 'plan' needs next_use (from the epoch plans)")
    return FurthestNextUse(next_use)


@eviction_policy("belady")
def belady(capacity: int, next_use: NextUse | None = None) -> Eviction:
    """The offline optimum: ``plan`` with the recorded trace's own next uses
    (``next_use=Uses(trace)``)."""
    if next_use is None:
        raise ValueError("eviction policy 'belady' needs next_use (Uses(trace))")
    return FurthestNextUse(next_use)


class Uses:
    """When each key is used: ``next_use(key, now)`` by a binary search.

    ``keys[i]`` is used at ``times[i]`` (default ``i``: the position in a trace).
    """

    def __init__(self, keys: Sequence[Any] | np.ndarray,
                 times: Sequence[int] | np.ndarray | None = None) -> None:
        keys = np.asarray(keys)
        times = (np.arange(len(keys), dtype=np.int64) if times is None
                 else np.asarray(times, dtype=np.int64))
        if times.shape != keys.shape:
            raise ValueError(f"{len(times)} times for {len(keys)} keys")
        order = np.lexsort((times, keys))
        self._times: list[int] = times[order].tolist()
        unique, first = np.unique(keys[order], return_index=True)
        last = np.append(first[1:], len(keys))[:len(first)]     # none for no keys
        self._span = dict(zip(unique.tolist(), zip(first.tolist(), last.tolist(),
                                                   strict=True), strict=True))

    def __call__(self, key: Any, now: int) -> float:
        """The first time after ``now`` that ``key`` is used (``math.inf``: never)."""
        span = self._span.get(key)
        if span is None:
            return math.inf
        i = bisect_right(self._times, now, *span)
        return float(self._times[i]) if i < span[1] else math.inf


# -- simulation --------------------------------------------------------------------------
@dataclass
class Simulated:
    """What a cache did over a trace."""

    hits: int = 0
    misses: int = 0
    fetched: int = 0                # bytes fetched from the source (one per miss)
    evictions: int = 0
    victims: list[Any] = field(default_factory=list)    # in eviction order

    @property
    def hit_ratio(self) -> float:
        return self.hits / max(1, self.hits + self.misses)


def simulate(trace: Iterable[Any], sizes: Any, capacity: int, policy: str | EvictionPolicy,
             next_use: NextUse | None = None, pinned: Container[Any] = frozenset(),
             low: int | None = None) -> Simulated:
    """Replays ``trace`` (keys in access order) through a cache of ``capacity``
    bytes evicting by ``policy``; ``sizes[key]`` is a key's size.  A miss fetches
    the key and keeps it, unless even the victims cannot make room (a key larger
    than the cache, or the rest pinned): then it is served and not kept.  ``low``:
    a miss that must evict frees down to ``low`` bytes (the servers' low watermark),
    not just the room it needs."""
    if capacity <= 0:
        raise ValueError(f"capacity must be positive, not {capacity}")
    floor = capacity if low is None else min(capacity, max(0, low))
    make = EVICTION[policy] if isinstance(policy, str) else policy
    state = make(capacity, next_use)
    if isinstance(sizes, np.ndarray):
        sizes = sizes.tolist()              # Python ints index faster in the loop
    keys = trace.tolist() if isinstance(trace, np.ndarray) else trace
    cached: dict[Any, int] = {}
    used = 0
    out = Simulated()
    for now, key in enumerate(keys):
        if key in cached:
            out.hits += 1
            state.hit(key, now)
            continue
        size = int(sizes[key])
        out.misses += 1
        out.fetched += size
        if used + size > capacity:
            for victim in state.victims(used + size - floor, now, pinned):
                used -= cached.pop(victim)
                out.victims.append(victim)
            out.evictions = len(out.victims)
        if used + size <= capacity:
            cached[key] = size
            used += size
            state.admit(key, size, now)
    return out
