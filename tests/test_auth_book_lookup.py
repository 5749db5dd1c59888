"""The capability book's look-up: a batch's files share one entry, found without a
per-file loop, and still never shown once stale or missing.

The book is driven directly with a stand-in for the metadata connection that answers
the ``capabilities`` route as the metadata server does (one signed batch text, on
the batch's first file, null on the others), and with a clock the test moves.
"""

from __future__ import annotations

import secrets
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from stager.auth.tokens import Capability, sign
from stager.client.capabilities import MARGIN, CapabilityBook

KEY = Ed25519PrivateKey.generate()
HOLDER = "b" * 32
TTL = 3600.0


class Meta:
    """Answers capability requests with one batch text per request, at ``now``."""

    def __init__(self) -> None:
        self.now = 1_000_000.0
        self.asked: list[list[str]] = []

    async def request(self, _route: Any, body: dict[str, Any]) -> dict[str, Any]:
        files = list(body["file_ids"])
        self.asked.append(files)
        text = sign(KEY, Capability.batch(files, "read", HOLDER, self.now, TTL))
        return {"results": [{"file_id": f, "capability": text if i == 0 else None}
                            for i, f in enumerate(files)]}


def ids(n: int) -> list[str]:
    return [secrets.token_hex(16) for _ in range(n)]


async def test_a_batch_is_one_text_and_is_fetched_anew_once_stale() -> None:
    meta = Meta()
    book = CapabilityBook(meta.request, clock=lambda: meta.now)
    files = ids(6)
    await book.plan("read", files)
    assert len(meta.asked) == 1
    first = await book.header("read", files[:3])
    assert first is not None and len(first.split()) == 1        # the batch's text, once
    assert await book.header("read", files[3:]) == first
    # fresh until MARGIN before expiry: nothing asked again
    meta.now += TTL - MARGIN - 1
    assert await book.header("read", files[::2]) == first and len(meta.asked) == 1
    # past it, the shared entry is stale for every file of the batch: fetched anew
    meta.now += 2
    again = await book.header("read", files[1:4])
    assert len(meta.asked) == 2 and meta.asked[1] == files[1:4]
    assert again is not None and again != first and len(again.split()) == 1


async def test_a_file_not_held_among_held_ones_is_fetched() -> None:
    meta = Meta()
    book = CapabilityBook(meta.request, clock=lambda: meta.now)
    held, other = ids(4), ids(1)
    await book.plan("read", held)
    header = await book.header("read", [*held, *other])
    assert meta.asked[1:] == [other]                            # only the missing one
    assert header is not None and len(header.split()) == 2      # two batches, each once
