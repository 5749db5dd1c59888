"""What several metadata servers on one PostgreSQL database share: soft state, and
which of them runs the background duties.

The soft state (suspect targets, targets being retired, rebuild progress, the
last fsck) is a table of small JSON documents by key.  The duties (garbage
collection, rebuild, fsck) go to whichever server holds a session advisory lock
(``pg_try_advisory_lock``) on a connection of its own, outside the pool: when
that server dies, its connection drops, PostgreSQL frees the lock, and the next
server to try takes it.  No election of our own: only PostgreSQL's lock.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import asyncpg

from ....protocol.models import TargetInfo

log = logging.getLogger("stager.meta")

# One lock for all the duties: they touch the same files and targets, so one holder.
DUTY_LOCK_SQL = "hashtext('stager background duties')"


async def put_state(conn: asyncpg.Connection, key: str, value: dict[str, Any] | None) -> None:
    if value is None:
        await conn.execute("DELETE FROM shared_state WHERE key = $1", key)
        return
    await conn.execute("INSERT INTO shared_state (key, value) VALUES ($1, $2) "
                       "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                       key, json.dumps(value))


async def get_states(conn: asyncpg.Connection, prefix: str) -> dict[str, dict[str, Any]]:
    rows = await conn.fetch("SELECT key, value FROM shared_state "
                            "WHERE left(key, $1) = $2 ORDER BY key", len(prefix), prefix)
    return {str(r[0]): json.loads(r[1]) for r in rows}


async def live_reports(conn: asyncpg.Connection, now: float) -> dict[str, dict[str, Any]]:
    await conn.execute("DELETE FROM job_reports WHERE expires <= $1", now)
    rows = await conn.fetch("SELECT key, body FROM job_reports ORDER BY key")
    return {str(r[0]): json.loads(r[1]) for r in rows}


async def put_reports(conn: asyncpg.Connection,
                      reports: Sequence[tuple[str, dict[str, Any], float]]) -> None:
    """Every report in one statement (unnest: one round trip, whatever their number);
    a key twice would be a row changed twice by one statement, so its last is kept."""
    last = {key: (json.dumps(body), expires) for key, body, expires in reports}
    keys = sorted(last)     # one lock order for every server: no deadlock between two
    await conn.execute(
        "INSERT INTO job_reports (key, body, expires) "
        "SELECT * FROM unnest($1::text[], $2::text[], $3::float8[]) "
        "ON CONFLICT (key) DO UPDATE SET body = EXCLUDED.body, expires = EXCLUDED.expires",
        keys, [last[k][0] for k in keys], [last[k][1] for k in keys])


async def touch_targets(conn: asyncpg.Connection, targets: Sequence[TargetInfo]) -> None:
    """Many heartbeats in one statement (unnest), as :func:`put_reports` stores reports;
    a stored ``removed`` state stays (an operator's word)."""
    ts = sorted({t.id: t for t in targets}.values(), key=lambda t: t.id)
    await conn.execute(
        "INSERT INTO targets (id, node, url, capacity, used, chunks, last_heartbeat, state) "
        "SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::int8[], "
        "$6::int8[], $7::float8[], $8::text[]) ON CONFLICT (id) DO UPDATE SET "
        "node = EXCLUDED.node, url = EXCLUDED.url, capacity = EXCLUDED.capacity, "
        "used = EXCLUDED.used, chunks = EXCLUDED.chunks, "
        "last_heartbeat = EXCLUDED.last_heartbeat, state = CASE WHEN targets.state = "
        "'removed' THEN targets.state ELSE EXCLUDED.state END",
        [t.id for t in ts], [t.node for t in ts], [t.url for t in ts],
        [t.capacity for t in ts], [t.used for t in ts], [t.chunks for t in ts],
        [t.last_heartbeat for t in ts], [t.state for t in ts])


class DutyLock:
    """The advisory lock of the background duties, on a connection of its own."""

    def __init__(self, url: str, connect_timeout: float) -> None:
        self.url = url
        self.connect_timeout = connect_timeout
        self._conn: asyncpg.Connection | None = None
        self.held = False

    async def hold(self) -> bool:
        """Whether this server holds the lock now; tries to take it if not.  A lost
        connection loses the lock (PostgreSQL frees it): False until taken again."""
        try:
            if self._conn is None or self._conn.is_closed():
                self._lost()
                self._conn = await asyncpg.connect(
                    self.url, timeout=self.connect_timeout,
                    server_settings={"application_name": "stager-meta-duties"})
            if self.held:
                await self._conn.fetchval("SELECT 1", timeout=self.connect_timeout)
            else:
                self.held = bool(await self._conn.fetchval(
                    f"SELECT pg_try_advisory_lock({DUTY_LOCK_SQL})",
                    timeout=self.connect_timeout))
                if self.held:
                    log.info("this metadata server now runs the background duties")
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("background duties: the database connection failed (%s)", exc)
            self._lost()
        return self.held

    def _lost(self) -> None:
        if self.held:
            log.warning("this metadata server no longer runs the background duties")
        self.held = False
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None

    async def aclose(self) -> None:
        """Release the lock (by closing its connection)."""
        self.held = False
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                await conn.close(timeout=2)
            except Exception:
                conn.terminate()

    def terminate(self) -> None:
        self.held = False
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None
