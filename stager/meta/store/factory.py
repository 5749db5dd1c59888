"""Which metadata store a server opens: ``config.meta_store`` decides."""

from __future__ import annotations

from pathlib import Path

from ...config import Config
from ...errors import BadRequest, NotFound
from .base import MetaStore
from .sqlite.store import SQLiteStore

# PostgreSQL's store (and asyncpg) is imported where a URL names it: a SQLite
# metadata server does not load it.
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(url: str) -> bool:
    return url.startswith(POSTGRES_SCHEMES)


def open_store(config: Config) -> MetaStore:
    """PostgreSQL when ``config.meta_store`` names a database (``postgresql://USER@HOST:
    PORT/DB``), else SQLite in ``ROOT/meta.sqlite3``."""
    if not config.meta_store:
        return SQLiteStore(Path(config.root) / "meta.sqlite3")
    if is_postgres_url(config.meta_store):
        from .postgres.store import PostgreSQLStore
        return PostgreSQLStore(config.meta_store, connect_timeout=config.connect_timeout)
    raise BadRequest(f"unknown metadata store {config.meta_store!r}: give "
                     "postgresql://USER@HOST:PORT/DB, or nothing for SQLite under ROOT")


def sqlite_path(spec: str) -> Path:
    """The file a ``sqlite:PATH`` store names (``sqlite:///abs/path`` too); a directory
    (a metadata server's ROOT) names its ``meta.sqlite3``."""
    path = Path(spec.removeprefix("sqlite:").removeprefix("//"))
    return path / "meta.sqlite3" if path.is_dir() else path


def store_at(spec: str, *, must_exist: bool = False) -> MetaStore:
    """The store a URL names: ``sqlite:PATH`` or ``postgresql://USER@HOST:PORT/DB``.
    With ``must_exist``, a SQLite file that is not there is refused (not made)."""
    if is_postgres_url(spec):
        from .postgres.store import PostgreSQLStore
        return PostgreSQLStore(spec)
    if spec.startswith("sqlite:"):
        path = sqlite_path(spec)
        if must_exist and not path.is_file():
            raise NotFound(f"no SQLite metadata store at {path}", path=str(path))
        return SQLiteStore(path)
    raise BadRequest(f"unknown metadata store {spec!r}: give sqlite:PATH (a meta.sqlite3 "
                     "file, or a metadata server's ROOT) or postgresql://USER@HOST:PORT/DB")
