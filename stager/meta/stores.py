"""Which metadata store a server opens: ``config.meta_store`` decides."""

from __future__ import annotations

from pathlib import Path

from ..config import Config
from ..errors import BadRequest
from .pg import PostgreSQLStore, is_postgres_url
from .sqlite import SQLiteStore
from .store import MetaStore


def open_store(config: Config) -> MetaStore:
    """PostgreSQL when ``config.meta_store`` names a database (``postgresql://USER@HOST:
    PORT/DB``), else SQLite in ``ROOT/meta.sqlite3``."""
    if not config.meta_store:
        return SQLiteStore(Path(config.root) / "meta.sqlite3")
    if is_postgres_url(config.meta_store):
        return PostgreSQLStore(config.meta_store, connect_timeout=config.connect_timeout)
    raise BadRequest(f"unknown metadata store {config.meta_store!r}: give "
                     "postgresql://USER@HOST:PORT/DB, or nothing for SQLite under ROOT")
