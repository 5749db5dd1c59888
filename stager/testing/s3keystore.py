"""Conformance tests of the :class:`~stager.meta.store.s3keys.S3Keys` role, run with
:class:`.MetaStoreTests`::

    class TestMyStore(MetaStoreTests, S3KeyStoreTests): ...

A key is found by its access key, kept across a reopen, listed oldest first; a batch
naming an access key already there is refused whole.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ..errors import AlreadyExists
from ..meta.store.base import MetaStore
from ..meta.store.s3keys import S3KeyRecord


def s3key(name: str, token: str = "t" * 32, created: int = 100) -> S3KeyRecord:
    return S3KeyRecord(f"STG{name.upper():0>17}", token, b"sealed:" + name.encode(), created)


class S3KeyStoreTests:
    """Mixed into a :class:`.MetaStoreTests` subclass (its ``open_store``)."""

    async def test_s3_keys_are_found_listed_and_kept(
            self, open_store: Callable[[], MetaStore]) -> None:
        store = open_store()
        a, b, c = s3key("a", created=300), s3key("b", "b" * 32, 100), s3key("c", created=200)
        try:
            assert await store.list_s3_keys() == []
            await store.put_s3_keys([a])
            await store.put_s3_keys([b, c])
            found = await store.find_s3_keys([a.access_key, "STGNOSUCHKEY", c.access_key])
            assert found == {a.access_key: a, c.access_key: c}
            assert await store.find_s3_keys([]) == {}
            with pytest.raises(AlreadyExists):          # one taken: none of the batch
                await store.put_s3_keys([s3key("d"), s3key("a", created=1)])
            assert await store.find_s3_keys([s3key("d").access_key]) == {}
        finally:
            store.close()
        store = open_store()
        try:
            assert await store.list_s3_keys() == [b, c, a]
        finally:
            store.close()
