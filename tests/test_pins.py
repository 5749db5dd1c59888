"""Pins through a real cluster, on each metadata store: ``stager pin`` / ``unpin``, the
client, the routes, ``stager status``; and their TTL on the service's clock."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import STORES, cluster_on_each_store, raw_http

from stager import Client
from stager.cli.main import main
from stager.config import load_config
from stager.errors import NotFound
from stager.meta.quotas import QuotaService
from stager.meta.store.sqlite.store import SQLiteStore
from stager.protocol.routes import route
from stager.testing import ThreadCluster

_cluster = pytest.fixture(scope="module", params=STORES, name="cluster")(cluster_on_each_store)


@pytest.fixture(scope="module")
def client(cluster: ThreadCluster) -> Iterator[Client]:
    c = Client(cluster.meta_url, config=load_config(env={}))
    yield c
    c.close()


def test_pin_unpin_and_list(client: Client, ns: str) -> None:
    client.pipe(f"{ns}/d/f", b"x")
    pinned = client.pin(f"{ns}/d")
    assert (pinned.path, pinned.expires) == (f"{ns}/d", None)
    timed = client.pin(f"{ns}/d/f", ttl=600)
    assert timed.expires is not None and 590 < timed.expires - time.time() <= 600
    assert {p.path for p in client.pins()} >= {f"{ns}/d", f"{ns}/d/f"}
    status = client.status()
    assert {"path": f"{ns}/d", "expires": None, "created": pinned.created} in status["pins"]
    client.unpin(f"{ns}/d")
    assert f"{ns}/d" not in {p.path for p in client.pins()}
    with pytest.raises(NotFound):
        client.unpin(f"{ns}/d")
    with pytest.raises(NotFound):
        client.pin(f"{ns}/nothing")


def test_a_pin_ends_with_its_ttl(client: Client, ns: str) -> None:
    client.pipe(f"{ns}/f", b"x")
    client.pin(f"{ns}/f", ttl=0.5)
    assert f"{ns}/f" in {p.path for p in client.pins()}
    time.sleep(1.0)
    assert f"{ns}/f" not in {p.path for p in client.pins()}


def test_a_bad_ttl_is_a_clean_400(cluster: ThreadCluster, client: Client, ns: str) -> None:
    client.pipe(f"{ns}/f", b"x")
    for body in (b'{"ttl": 0}', b'{"ttl": "soon"}', b'{"ttl": 1e12}', b"[]"):
        reply = raw_http(cluster.meta_url, "PUT", route("pin").target(path=f"{ns}/f"), body,
                         {"Content-Type": "application/json"})
        assert reply.status == 400 and reply.json()["error"] == "bad_request", body


def test_the_cli_pins_lists_and_unpins(cluster: ThreadCluster, client: Client, ns: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    client.pipe(f"{ns}/f", b"x")
    meta = ["--meta", cluster.meta_url]
    assert main([*meta, "pin", f"{ns}/f"]) == 0
    assert capsys.readouterr().out.strip().split() == ["pinned", f"{ns}/f", "until",
                                                       "unpinned"]
    assert main([*meta, "pin", f"{ns}/f", "--ttl", "3600"]) == 0
    assert capsys.readouterr().out.startswith(f"pinned {ns}/f")
    assert main([*meta, "pin", "--list"]) == 0
    assert any(line.startswith(f"{ns}/f ") for line in capsys.readouterr().out.splitlines())
    assert main([*meta, "status"]) == 0
    assert any(line.startswith("pin ") and f"{ns}/f" in line
               for line in capsys.readouterr().out.splitlines())
    assert main([*meta, "unpin", f"{ns}/f"]) == 0
    assert capsys.readouterr().out.strip() == f"unpinned {ns}/f"
    assert main([*meta, "unpin", f"{ns}/f"]) == 1
    assert "is not pinned" in capsys.readouterr().err


async def test_is_pinned_follows_the_services_clock(tmp_path: Path) -> None:
    now = [1000.0]
    store = SQLiteStore(tmp_path / "meta.sqlite3")
    try:
        service = QuotaService(store, clock=lambda: now[0])
        await store.mkdir("/data/set", parents=True, exist_ok=False, now=1.0)
        await service.pin("/data", ttl=60)
        assert await service.is_pinned("/data/set/any")
        assert not await service.is_pinned("/database")     # a prefix of the name is not
        now[0] += 60
        assert not await service.is_pinned("/data/set/any")
        assert await service.pins() == []
    finally:
        store.close()
