"""The memos kept in a :class:`~stager.bounded.Bounded` keep the order and bounds they
had by hand: which entry leaves first, and what a hit does to the order."""

from __future__ import annotations

from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from stager.auth import Capability
from stager.auth.cache import VerifiedCache
from stager.meta import auth as meta_auth
from stager.meta.writes import Begun, SpecHints
from stager.protocol.models import LayoutSpec

NOW = 1_000_000.0
HOLDER = "0" * 32


def verified(size: int, max_bytes: int) -> tuple[VerifiedCache[Capability], list[str]]:
    checked: list[str] = []

    def check(text: str, now: float) -> Capability:
        checked.append(text)
        return Capability("f" * 32, "read", int(now) + 600, HOLDER)
    return VerifiedCache(check, size=size, max_bytes=max_bytes), checked


def test_a_verified_cache_keeps_the_most_recently_used_by_count() -> None:
    cache, checked = verified(size=2, max_bytes=1 << 20)
    for text in ("a", "b", "a", "c"):       # the hit on "a" keeps it over "b"
        cache.verify(text, NOW)
    assert checked == ["a", "b", "c"]
    assert cache.known("a") and not cache.known("b") and cache.known("c")
    assert (cache.hits, cache.misses) == (1, 3)


def test_a_verified_cache_keeps_its_texts_within_max_bytes_but_one() -> None:
    cache, _ = verified(size=100, max_bytes=25)
    for text in ("a" * 10, "b" * 10, "c" * 10):
        cache.verify(text, NOW)
    assert len(cache) == 2 and not cache.known("a" * 10)
    cache.verify("d" * 40, NOW)             # alone over the budget: kept, alone
    assert len(cache) == 1 and cache.known("d" * 40)
    cache.forget("d" * 40)
    cache.verify("e" * 20, NOW)             # the forgotten text's bytes were given back
    cache.verify("f", NOW)
    assert len(cache) == 2


def test_minted_capabilities_are_reused_and_the_oldest_minted_leave_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meta_auth, "MINTED_CACHE", 2)
    store: Any = None                       # capability() never asks the store
    clock = [NOW]
    auth = meta_auth.MetaAuth(Ed25519PrivateKey.generate(), store, clock=lambda: clock[0])
    a = auth.capability("a" * 32, "read", HOLDER)
    b = auth.capability("b" * 32, "read", HOLDER)
    clock[0] += 1                           # a capability minted from now on differs
    assert auth.capability("a" * 32, "read", HOLDER) == a   # a reuse: "a" stays oldest
    auth.capability("c" * 32, "read", HOLDER)
    assert auth.capability("b" * 32, "read", HOLDER) == b
    assert auth.capability("a" * 32, "read", HOLDER) != a   # put out: minted anew


def test_spec_hints_keep_the_latest_learnt_directories() -> None:
    hints = SpecHints(kept=2)
    one, two = LayoutSpec(chunk_size=1 << 20), LayoutSpec(chunk_size=2 << 20)
    hints.learn("/a", one)
    hints.learn("/b", one)
    hints.learn("/a", two)                  # learnt again: the newest
    hints.learn("/c", one)
    assert hints.get("/a") == two and hints.get("/b") == LayoutSpec()


class _Upload:
    def __init__(self, file_id: str, chunk_size: int) -> None:
        self.file_id = file_id
        self.layout = LayoutSpec(chunk_size=chunk_size)


def test_begun_uploads_leave_in_the_order_first_begun() -> None:
    begun = Begun(kept=2)
    uploads: Any = [_Upload("a", 1), _Upload("b", 2)]
    begun.add(uploads)
    again: Any = [_Upload("a", 3), _Upload("c", 4)]
    begun.add(again)                        # "a" begun again keeps its first place
    assert begun.take("a") is None
    assert (begun.take("b"), begun.take("c")) == (2, 4)
