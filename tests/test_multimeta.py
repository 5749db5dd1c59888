"""Several metadata servers on one PostgreSQL store (issue 19, part 2): one
namespace, the same targets, one holder of the background duties, revocations
seen by all."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stager import Client
from stager.errors import Unauthenticated
from stager.meta.pg import PostgreSQLStore
from stager.testing import ProcessCluster


async def test_one_store_of_several_holds_the_duties_until_it_goes(pg_url: str) -> None:
    first, second = PostgreSQLStore(pg_url), PostgreSQLStore(pg_url)
    try:
        assert await first.hold_duties()
        assert not await second.hold_duties()
        assert await first.hold_duties()             # held, not taken again
        first.close()                                 # its lock connection drops
        assert await second.hold_duties()
        third = PostgreSQLStore(pg_url)
        try:
            assert not await third.hold_duties()
        finally:
            third.close()
    finally:
        first.close()
        second.close()


def wait_for(what: Callable[[], Any], timeout: float, step: float = 0.05) -> float:
    """Seconds until ``what()`` is true; fails after ``timeout``."""
    start = time.monotonic()
    while not what():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not true within {timeout}s: {what}")
        time.sleep(step)
    return time.monotonic() - start


@pytest.fixture
def two_metas(tmp_path: Path, pg_url: str) -> Iterator[ProcessCluster]:
    with ProcessCluster(tmp_path / "c", data_servers=2, auth=True, meta_store=pg_url,
                        meta_servers=2) as cluster:
        yield cluster


def test_two_metadata_servers_share_namespace_targets_revocations_and_duties(
        two_metas: ProcessCluster) -> None:
    cluster = two_metas
    assert len(cluster.meta_urls) == 2 and cluster.info["meta"] == cluster.info["metas"][0]
    admin = cluster.admin_token
    a, b = (Client(url, token=admin) for url in cluster.meta_urls)
    try:
        # A file created through one is read through the other.
        a.pipe("/shared/kept", b"kept")
        a.pipe("/shared/f", b"through a" * 1000)
        assert b.cat("/shared/f") == b"through a" * 1000
        b.rm("/shared/f")
        assert not a.exists("/shared/f")

        # The same targets, in the same states (heartbeats reach only the first).
        def states(c: Client) -> list[tuple[str, str]]:
            return [(t.id, t.state) for t in c.targets()]
        wait_for(lambda: states(a) == states(b) and len(states(a)) == 2, 5)
        assert {s for _, s in states(b)} == {"up"}

        # A token revoked through one is refused by the other within about a second.
        made = a.create_token(["read"], ["/"], 600, "revoked soon")
        reader = Client(cluster.meta_urls[1], token=made.token)
        try:
            assert reader.ls("/") is not None
            a.revoke_token(made.info.id)

            def refused() -> bool:
                try:
                    reader.ls("/")
                except Unauthenticated:
                    return True
                return False
            assert wait_for(refused, 2.0) < 2.0
        finally:
            reader.close()

        # The background duties run on exactly one of them...
        def holders() -> list[bool]:
            return [c.status()["duties"]["held"] for c in (a, b)]
        wait_for(lambda: sum(holders()) == 1, 5)
        holder = holders().index(True)
        other = (a, b)[1 - holder]
        # ... and move to the other within seconds when the holder is killed.
        cluster.kill_meta(holder)
        moved = wait_for(lambda: other.status()["duties"]["held"], 10)
        print(f"duties moved in {moved:.2f}s")
        assert other.cat("/shared/kept") == b"kept"
    finally:
        a.close()
        b.close()
