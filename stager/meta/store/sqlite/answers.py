"""The SQL of recorded answers to requests sent with an idempotency key.

A client that lost the connection after sending a create, commit, rename or remove
sends it again, with the same key, maybe to another metadata server; the answer
recorded here is given instead of acting twice (stager/web/idempotency.py).  The
table is made here, where its SQL lives, so the namespace schema stays as it was.
"""

from __future__ import annotations

from .db import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS answers (
    key     TEXT PRIMARY KEY,
    status  INTEGER NOT NULL,
    body    BLOB NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS answers_created ON answers (created);
"""


class AnswerSQL:
    def __init__(self, database: Database) -> None:
        self.database = database
        self.db = database.db
        self.db.executescript(SCHEMA)

    def get(self, key: str) -> tuple[int, bytes] | None:
        row = self.db.execute("SELECT status, body FROM answers WHERE key = ?",
                              (key,)).fetchone()
        return None if row is None else (int(row[0]), bytes(row[1]))

    def put(self, key: str, status: int, body: bytes, now: float) -> bool:
        # its own transaction, or a savepoint in the group commit it shares
        with self.database.transaction():
            cur = self.db.execute("INSERT OR IGNORE INTO answers (key, status, body, created) "
                                  "VALUES (?, ?, ?, ?)", (key, status, body, now))
        return cur.rowcount == 1

    def expire(self, before: float) -> int:
        return self.db.execute("DELETE FROM answers WHERE created < ?", (before,)).rowcount
