"""The SQLite store's connection: schema, transactions, and how values are encoded.

Shared by the helper objects that hold the store's SQL (:mod:`.sqlite.namespace`,
:mod:`.sqlite.reliability`, …); they all run on the store's
one thread (:mod:`.sqlite.thread`), so one connection serves them all.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import struct
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ....protocol import paths
from ....protocol.models import Layout
from ..base import NodeEntry

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id        INTEGER PRIMARY KEY,
    parent    INTEGER NOT NULL,
    name      TEXT    NOT NULL,
    kind      TEXT    NOT NULL CHECK (kind IN ('file', 'directory')),
    size      INTEGER NOT NULL DEFAULT 0,
    mtime     REAL    NOT NULL,
    file_id   TEXT,
    layout    TEXT,
    checksums BLOB,
    attrs     TEXT,
    UNIQUE (parent, name)
);
CREATE TABLE IF NOT EXISTS uploads (
    file_id   TEXT PRIMARY KEY,
    path      TEXT NOT NULL,
    layout    TEXT NOT NULL,
    overwrite INTEGER NOT NULL,
    parents   INTEGER NOT NULL,
    created   REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS garbage (
    file_id   TEXT PRIMARY KEY,
    layout    TEXT NOT NULL,
    size      INTEGER NOT NULL,
    since     REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS target_credentials (
    target_id TEXT PRIMARY KEY,
    token_id  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS purged (
    file_id   TEXT PRIMARY KEY,
    at        REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS purged_at ON purged (at);
CREATE TABLE IF NOT EXISTS manifests (
    dir_id    INTEGER PRIMARY KEY REFERENCES entries (id) ON DELETE CASCADE,
    body      BLOB NOT NULL,
    created   REAL NOT NULL,
    gen       INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS entries_file_id ON entries (file_id);
CREATE TABLE IF NOT EXISTS tokens (
    id        TEXT PRIMARY KEY,
    name      TEXT NOT NULL,
    scopes    TEXT NOT NULL,
    prefixes  TEXT NOT NULL,
    created   INTEGER NOT NULL,
    expires   INTEGER NOT NULL,
    revoked   INTEGER
);
CREATE TABLE IF NOT EXISTS targets (
    id             TEXT PRIMARY KEY,
    node           TEXT NOT NULL,
    url            TEXT NOT NULL,
    capacity       INTEGER NOT NULL,
    used           INTEGER NOT NULL,
    chunks         INTEGER NOT NULL,
    last_heartbeat REAL NOT NULL,
    state          TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS shared_state (
    key       TEXT PRIMARY KEY,
    value     TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS quotas (
    dir_id     INTEGER PRIMARY KEY REFERENCES entries (id) ON DELETE CASCADE,
    max_bytes  INTEGER,
    max_files  INTEGER,
    used_bytes INTEGER NOT NULL,
    used_files INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS pins (
    path      TEXT PRIMARY KEY,
    expires   REAL,
    created   REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS job_reports (
    key       TEXT PRIMARY KEY,
    body      TEXT NOT NULL,
    expires   REAL NOT NULL
);
-- the managed cache (.sqlite.cache): attached directories, their files, and their
-- chunks filled (a chunk row without a crc is a fill leased to holder until until)
CREATE TABLE IF NOT EXISTS attachments (
    path      TEXT PRIMARY KEY,
    source    TEXT NOT NULL,
    options   BLOB NOT NULL,
    refresh   REAL,
    include   TEXT NOT NULL,
    exclude   TEXT NOT NULL,
    listed    REAL NOT NULL,
    created   REAL NOT NULL,
    hits      INTEGER NOT NULL DEFAULT 0,
    misses    INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS cached_files (
    file_id    TEXT PRIMARY KEY,
    attachment TEXT NOT NULL,
    path       TEXT NOT NULL,
    key        TEXT NOT NULL,
    version    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS cached_files_attachment ON cached_files (attachment);
CREATE TABLE IF NOT EXISTS cache_chunks (
    file_id   TEXT NOT NULL,
    idx       INTEGER NOT NULL,
    size      INTEGER NOT NULL DEFAULT 0,
    crc       INTEGER,
    filled    REAL NOT NULL DEFAULT 0,
    used      REAL NOT NULL DEFAULT 0,
    holder    TEXT,
    until     REAL,
    PRIMARY KEY (file_id, idx)
);
"""

ROOT_ID = 1

# Bumps the gen of every manifest on the given directories or their ancestors: the
# walk up the parent chain (a few rows per directory) joined to the small manifests table.
_BUMP = ("WITH RECURSIVE up(id) AS (SELECT value FROM json_each(?) UNION "
         "SELECT e.parent FROM entries e JOIN up ON e.id = up.id WHERE e.parent <> 0) "
         "UPDATE manifests SET gen = gen + 1 WHERE dir_id IN (SELECT id FROM up)")
_ANY_MANIFEST = "SELECT EXISTS (SELECT 1 FROM manifests)"


def pack(checksums: tuple[int, ...]) -> bytes:
    return struct.pack(f"<{len(checksums)}I", *checksums)


def unpack(blob: bytes | None) -> tuple[int, ...]:
    if not blob:
        return ()
    return struct.unpack(f"<{len(blob) // 4}I", blob)


def layout_text(layout: Layout) -> str:
    """How a layout is stored: one encoding everywhere, so that the compare-and-swap
    of :meth:`~.sqlite.reliability.ReliabilitySQL.replace_layout` is exact."""
    return json.dumps(layout.to_json())


def attrs_from(text: str | None) -> dict[str, Any]:
    """The attributes stored as ``text`` (``NULL``: none)."""
    return json.loads(text) if text else {}


@functools.lru_cache(maxsize=4096)
def layout_of(text: str) -> Layout:
    """The layout stored as ``text``.  Files written together mostly share one (the
    same targets, in the same order), and a Layout is immutable: parsed once."""
    return Layout.from_json(json.loads(text))


class Database:
    """One SQLite file: WAL, fsync on every commit, foreign keys on."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")   # fsync on every commit
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.executescript(SCHEMA)
        columns = {r[1] for r in self.db.execute("PRAGMA table_info(manifests)")}
        if "gen" not in columns:        # a database made before manifests had versions
            self.db.execute("ALTER TABLE manifests ADD COLUMN gen INTEGER NOT NULL DEFAULT 0")
        columns = {r[1] for r in self.db.execute("PRAGMA table_info(tokens)")}
        if "uses" not in columns:       # a database made before join tokens had limits
            self.db.execute("ALTER TABLE tokens ADD COLUMN uses INTEGER")
        columns = {r[1] for r in self.db.execute("PRAGMA table_info(entries)")}
        if "attrs" not in columns:      # a database made before file versions had attributes
            self.db.execute("ALTER TABLE entries ADD COLUMN attrs TEXT")
        # Directories whose manifests (theirs and their ancestors') the transaction
        # under way changes: bumped in one statement just before its COMMIT.
        self.changed: set[int] = set()
        self.db.execute(
            "INSERT OR IGNORE INTO entries (id, parent, name, kind, mtime) "
            "VALUES (?, 0, '', 'directory', strftime('%s','now'))", (ROOT_ID,))
        # A second connection for point reads on the event loop: in WAL mode a reader
        # never waits for the writer (it sees the last commit), so a stat costs a few
        # index lookups instead of a hop to the store thread and back.  timeout=0: where
        # SQLite would make it wait after all (WAL recovery), it fails at once and the
        # caller queues on the thread instead (SQLiteStore.stat).
        self.reader = sqlite3.connect(self.path, isolation_level=None,
                                      check_same_thread=False, timeout=0)
        self.reader.execute("PRAGMA query_only=ON")

    def close(self) -> None:
        self.reader.close()
        self.db.close()

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """The reader inside one read transaction: a path walked one component at a
        time sees one committed state, never half of a rename."""
        self.reader.execute("BEGIN")
        try:
            yield self.reader
        finally:
            self.reader.execute("COMMIT")

    def changed_below(self, dir_id: int) -> None:
        """The transaction under way changes what a manifest on directory ``dir_id``
        or on one of its ancestors resolves to.  One statement at the outermost COMMIT
        bumps them all, so a batch or a group commit pays it once; an item rolled
        back to its savepoint may leave its directory here, which only costs a
        manifest cache a resolution it did not need."""
        self.changed.add(dir_id)

    @contextmanager
    def unflushed(self) -> Iterator[None]:
        """Commits made inside do not wait for an fsync (``synchronous=NORMAL``): in WAL
        mode the database stays consistent, and what they wrote is lost only with the
        machine (a power cut, a kernel crash), never with this process; the next
        commit outside flushes it with its own.  Inside a transaction (a group commit)
        it changes nothing: that transaction's COMMIT comes later, flushed."""
        if self.db.in_transaction:
            yield
            return
        self.db.execute("PRAGMA synchronous=NORMAL")
        try:
            yield
        finally:
            self.db.execute("PRAGMA synchronous=FULL")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One transaction; inside another (a batch, a group commit) a savepoint, so
        that this operation fails alone and the enclosing transaction's one commit
        (one fsync) covers it."""
        if self.db.in_transaction:
            self.db.execute("SAVEPOINT op")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK TO op")
                self.db.execute("RELEASE op")
                raise
            self.db.execute("RELEASE op")
            return
        self.db.execute("BEGIN IMMEDIATE")
        self.changed.clear()
        try:
            yield self.db
            # the walk up costs tens of us a transaction; with no manifest, it bumps none
            if self.changed and self.db.execute(_ANY_MANIFEST).fetchone()[0]:
                self.db.execute(_BUMP, (json.dumps(sorted(self.changed)),))
        except BaseException:
            self.changed.clear()
            self.db.execute("ROLLBACK")
            raise
        self.changed.clear()
        try:
            self.db.execute("COMMIT")
        except BaseException:
            # Never leave a failed commit open: the next operation would nest in it.
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise


def subtree_entries(path: str, rows: Iterable[Sequence[Any]]) -> dict[str, NodeEntry]:
    """The files of a subtree query's ``(rel, size, mtime, file_id, layout, checksums)``
    rows, by path relative to ``path``; each distinct layout text parsed once.  Both
    stores' ``subtree_files`` end here."""
    layouts: dict[str, Layout] = {}
    out = {}
    for rel, size, mtime, file_id, layout, blob in rows:
        if layout not in layouts:
            layouts[layout] = layout_of(layout)
        out[rel] = NodeEntry(paths.join(path, rel), "file", size, mtime, file_id,
                             layout=layouts[layout], checksums=unpack(blob))
    return out
