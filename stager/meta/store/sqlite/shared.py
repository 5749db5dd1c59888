"""The SQL of the state metadata servers share (:mod:`.shared`), for SQLite.

SQLite has one metadata server, so nothing here is read back by another; the
documents are kept all the same, so that a restarted server finds its last
rebuild and fsck, and so that both stores pass one contract suite.
"""

from __future__ import annotations

import json
from typing import Any

from ....protocol.models import TargetInfo
from .db import Database


class SharedSQL:
    def __init__(self, database: Database) -> None:
        self.database = database
        self.db = database.db

    def put_state(self, key: str, value: dict[str, Any] | None) -> None:
        with self.database.transaction():
            if value is None:
                self.db.execute("DELETE FROM shared_state WHERE key = ?", (key,))
            else:
                self.db.execute("INSERT OR REPLACE INTO shared_state VALUES (?, ?)",
                                (key, json.dumps(value)))

    def get_states(self, prefix: str) -> dict[str, dict[str, Any]]:
        rows = self.db.execute(
            "SELECT key, value FROM shared_state WHERE substr(key, 1, ?) = ? ORDER BY key",
            (len(prefix), prefix)).fetchall()
        return {str(k): json.loads(v) for k, v in rows}

    def put_report(self, key: str, body: dict[str, Any], expires: float) -> None:
        with self.database.transaction():
            self.db.execute("INSERT OR REPLACE INTO job_reports VALUES (?, ?, ?)",
                            (key, json.dumps(body), expires))

    def live_reports(self, now: float) -> dict[str, dict[str, Any]]:
        with self.database.transaction():
            self.db.execute("DELETE FROM job_reports WHERE expires <= ?", (now,))
            rows = self.db.execute("SELECT key, body FROM job_reports ORDER BY key").fetchall()
        return {str(k): json.loads(b) for k, b in rows}

    def touch_target(self, t: TargetInfo) -> None:
        with self.database.transaction():
            self.db.execute(
                "INSERT INTO targets VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO "
                "UPDATE SET node = excluded.node, url = excluded.url, "
                "capacity = excluded.capacity, used = excluded.used, "
                "chunks = excluded.chunks, last_heartbeat = excluded.last_heartbeat, "
                "state = CASE WHEN targets.state = 'removed' THEN targets.state "
                "ELSE excluded.state END",
                (t.id, t.node, t.url, t.capacity, t.used, t.chunks, t.last_heartbeat,
                 t.state))
