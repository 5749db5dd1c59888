"""A batch of heartbeats, or of loader reports, is one statement on PostgreSQL (issue 30:
a data server's batch cost one transaction per target where several metadata servers
share the store), with the effect of as many single ones.  Statements are counted on the
real connection (asyncpg's query logger), transactions by the database's own
transaction ids."""

from __future__ import annotations

from typing import Any

from test_pg_roundtrips import watched

from stager.config import Config
from stager.errors import NotFound
from stager.meta.jobtable import JobTable
from stager.meta.service import MetaService
from stager.meta.store.postgres.store import PostgreSQLStore
from stager.protocol.models import TargetInfo
from stager.testing.postgres import PostgresServer

N = 20


async def xact_id(store: PostgreSQLStore) -> int:
    """A new transaction id: each transaction that wrote since the last took one."""
    pool = await store.db.pool(True)
    async with pool.acquire() as conn:
        return int(await conn.fetchval("SELECT pg_current_xact_id()::text::bigint"))


async def service(url: str) -> MetaService:
    svc = MetaService(PostgreSQLStore(url, pool_size=1), Config(target_timeout=3.0))
    await svc.start()
    for i in range(N):
        await svc.register_target(TargetInfo(f"t{i:02}", f"n{i}", f"http://127.0.0.1:{i + 1}"))
    await svc.set_target_state("t03", "removed")      # an operator's word stays
    svc.clock = lambda: 1e9                            # both services beat at one time
    return svc


def beats() -> list[tuple[str, int, int, int]]:
    return [(f"t{i:02}", 1000 + i, i, 2 * i) for i in range(N)] + [("nobody", 1, 0, 0)]


def stored(targets: list[TargetInfo]) -> list[tuple[Any, ...]]:
    return [(t.id, t.capacity, t.used, t.chunks, t.last_heartbeat, t.state) for t in targets]


async def test_a_batch_of_heartbeats_is_one_statement_with_the_effect_of_singles(
        postgres: PostgresServer, pg_url: str) -> None:
    batched, single = await service(pg_url), await service(postgres.create_database())
    store = batched.store
    assert isinstance(store, PostgreSQLStore)
    try:
        seen = await watched(store)
        await batched.heartbeats(beats())   # asyncpg learns the array types once
        before = await xact_id(store)
        seen.clear()
        results = await batched.heartbeats(beats())
        after = await xact_id(store)
        # one INSERT ... unnest for the N targets, no BEGIN and COMMIT; one transaction
        # between the two ids (the second id's own is the other)
        assert [q.split(" (")[0] for q in seen[:-1]] == ["INSERT INTO targets"]
        assert after - before == 2
        for beat in beats():
            try:
                await single.heartbeat(beat[0], capacity=beat[1], used=beat[2], chunks=beat[3])
            except NotFound:
                pass
        assert [r.used if isinstance(r, TargetInfo) else type(r) for r in results] == [
            *range(N), NotFound]
        assert stored(await batched.store.list_targets()) == stored(
            await single.store.list_targets())
        assert stored(batched.list_targets()) == stored(single.list_targets())
        assert batched.targets["t03"].state == "removed"
        assert (await batched.store.list_targets())[5].last_heartbeat == 1e9
    finally:
        batched.close()
        single.close()


async def test_a_batch_of_reports_is_one_statement_with_the_effect_of_singles(
        postgres: PostgresServer, pg_url: str) -> None:
    a = PostgreSQLStore(pg_url, pool_size=1)
    b = PostgreSQLStore(postgres.create_database(), pool_size=1)
    try:
        table_a, table_b = JobTable(store=a), JobTable(store=b)
        body = {"interval": 60.0, "world_size": N}
        entries = [table_a.report("job", r, w, dict(body, samples=r))
                   for r in range(N) for w in (None, 0)]
        entries.append(table_a.report("job", 0, None, dict(body, samples=99)))  # replaced
        for e in entries:
            await table_b.share(e)
        seen = await watched(a)
        await table_a.share(entries[0])     # asyncpg learns the array types once
        seen.clear()
        await table_a.share(*entries)
        assert [q.split(" (")[0] for q in seen] == ["INSERT INTO job_reports"]
        now = entries[0].received
        assert await a.live_reports(now) == await b.live_reports(now)
        assert len(await a.live_reports(now)) == 2 * N
        assert (await a.live_reports(now))["job/0/"]["report"]["samples"] == 99
        count = len(seen)
        await table_a.share()       # nothing to write: no statement
        assert len(seen) == count
    finally:
        a.close()
        b.close()

