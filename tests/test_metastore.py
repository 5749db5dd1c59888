"""Both metadata stores against the metadata store's conformance suite."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from stager.meta.pg import PostgreSQLStore
from stager.meta.sqlite import SQLiteStore
from stager.meta.store import MetaStore
from stager.testing.metastore import MetaStoreTests


class TestMetaStore(MetaStoreTests):
    @pytest.fixture(params=["sqlite", "postgresql"])
    def open_store(self, request: pytest.FixtureRequest,
                   tmp_path: Path) -> Callable[[], MetaStore]:
        if request.param == "sqlite":
            return lambda: SQLiteStore(tmp_path / "meta.sqlite3")
        url = request.getfixturevalue("pg_url")
        return lambda: PostgreSQLStore(url)
