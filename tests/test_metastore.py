"""The SQLite store against the metadata store's conformance suite."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from stager.meta.sqlite import SQLiteStore
from stager.meta.store import MetaStore
from stager.testing.metastore import MetaStoreTests


class TestSQLiteStore(MetaStoreTests):
    @pytest.fixture
    def open_store(self, tmp_path: Path) -> Callable[[], MetaStore]:
        return lambda: SQLiteStore(tmp_path / "meta.sqlite3")
