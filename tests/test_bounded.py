"""stager.bounded.Bounded: the one bounded memo, its order and its evictions."""

from __future__ import annotations

import pytest

from stager.bounded import Bounded


def test_put_keeps_the_newest_limit_entries() -> None:
    memo: Bounded[str, int] = Bounded(3)
    for i, key in enumerate("abcde"):
        memo.put(key, i)
    assert list(memo.items()) == [("c", 2), ("d", 3), ("e", 4)]


def test_put_makes_a_held_key_the_newest() -> None:
    memo: Bounded[str, int] = Bounded(2)
    memo.put("a", 1)
    memo.put("b", 2)
    memo.put("a", 3)            # refreshed: "b" is now the oldest
    memo.put("c", 4)
    assert list(memo.items()) == [("a", 3), ("c", 4)]


def test_lru_is_move_to_end_on_a_hit_and_insertion_order_is_not() -> None:
    lru: Bounded[str, int] = Bounded(2)
    fifo: Bounded[str, int] = Bounded(2)
    for memo in (lru, fifo):
        memo.put("a", 1)
        memo.put("b", 2)
    assert lru.get("a") == 1 and fifo.get("a") == 1
    lru.move_to_end("a")
    lru.put("c", 3)
    fifo.put("c", 3)
    assert list(lru) == ["a", "c"]
    assert list(fifo) == ["b", "c"]


def test_plain_sets_then_trim_keep_first_insertion_order() -> None:
    memo: Bounded[str, int] = Bounded(2)
    memo["a"] = 1
    memo["b"] = 2
    memo["a"] = 3                # a plain set leaves "a" where it was
    memo["c"] = 4
    assert len(memo) == 3       # over the limit until trimmed
    memo.trim()
    assert list(memo.items()) == [("b", 2), ("c", 4)]


def test_on_evict_sees_every_entry_put_out_and_only_those() -> None:
    out: list[tuple[str, int]] = []
    memo: Bounded[str, int] = Bounded(2, on_evict=lambda k, v: out.append((k, v)))
    for i, key in enumerate("abcd"):
        memo.put(key, i)
    memo.pop("c")                # removed by the caller: not an eviction
    del memo["d"]
    assert out == [("a", 0), ("b", 1)]
    memo.put("e", 5)
    assert memo.evict() == ("e", 5)
    assert out[-1] == ("e", 5) and not memo
    with pytest.raises(KeyError):
        memo.evict()


def test_evict_serves_a_second_bound() -> None:
    """A caller with a byte budget too evicts the oldest until within it."""
    held = {"size": 0}
    memo: Bounded[str, bytes] = Bounded(
        10, on_evict=lambda k, v: held.__setitem__("size", held["size"] - len(v)))
    for key in "abcd":
        memo.put(key, b"x" * 4)
        held["size"] += 4
        while held["size"] > 10:
            memo.evict()
    assert list(memo) == ["c", "d"] and held["size"] == 8


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        Bounded(0)


def test_it_is_an_ordered_dict() -> None:
    """Lookups are the C dictionary's: no Python frame on a hot path's hit."""
    from collections import OrderedDict
    memo: Bounded[str, int] = Bounded(4)
    assert isinstance(memo, OrderedDict)
    assert type(memo).__getitem__ is OrderedDict.__getitem__
    assert type(memo).get is OrderedDict.get
    assert type(memo).move_to_end is OrderedDict.move_to_end
