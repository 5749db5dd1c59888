"""Every server documents every route it serves, and counts what it serves."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from stager import Client
from stager.config import load_config
from stager.data.app import make_data_app
from stager.meta.http.app import SERVICE, make_meta_app
from stager.protocol.models import LayoutSpec
from stager.protocol.routes import ROUTES
from stager.testing import ThreadCluster


def router_operations(app: web.Application) -> set[tuple[str, str]]:
    """(path template, method) of every route the aiohttp router has."""
    ops = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("formatter") or info.get("path")
        assert path, route
        ops.add((re.sub(r"\{(\w+):[^}]*\}", r"{\1}", path), route.method.upper()))
    return ops


def document_operations(doc: dict) -> set[tuple[str, str]]:  # type: ignore[type-arg]
    return {(path, method.upper()) for path, item in doc["paths"].items() for method in item}


@pytest.fixture
def apps(tmp_path: Path) -> Iterator[dict[str, web.Application]]:
    """The two applications as the servers build them (not started)."""
    config = load_config({"root": str(tmp_path / "meta")}, env={})
    meta = make_meta_app(config)
    data = make_data_app(config.replace(root=str(tmp_path / "data")))
    yield {"meta": meta, "data": data}
    meta[SERVICE].close()


@pytest.mark.parametrize("role", ["meta", "data"])
def test_openapi_covers_every_route(cluster: ThreadCluster, http, apps, role: str) -> None:
    url = cluster.meta_url if role == "meta" else cluster.data[0].url  # type: ignore[union-attr]
    r = http(url, "GET", "/openapi.json")
    assert r.status == 200 and r.headers["Content-Type"].startswith("application/json")
    doc = r.json()
    assert doc["openapi"].startswith("3.") and doc["info"]["title"] == f"stager {role} server"
    served = router_operations(apps[role])
    documented = document_operations(doc)
    assert served == documented, (served ^ documented)
    for common in ("/v1/health", "/openapi.json", "/metrics"):
        assert (common, "GET") in documented
    # every operation names its responses; every $ref resolves
    for path, item in doc["paths"].items():
        for method, op in item.items():
            assert op["operationId"] and op["responses"], (path, method)
    schemas = doc["components"]["schemas"]
    refs = list(_refs(doc))
    assert refs
    for ref in refs:
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas


def _refs(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def test_route_table_matches_both_servers(apps) -> None:  # type: ignore[no-untyped-def]
    table = {(re.sub(r"\{(\w+):[^}]*\}", r"{\1}", r.path), r.method) for r in ROUTES}
    served = router_operations(apps["meta"]) | router_operations(apps["data"])
    assert served == table
    assert len({r.op for r in ROUTES}) == len(ROUTES), "operation ids must be unique"


def test_metrics_are_prometheus_text_with_request_counts(cluster: ThreadCluster, http,
                                                         client: Client, ns: str) -> None:
    # three 64 KiB chunks over all three targets: every data server receives one
    client.pipe(f"{ns}/m.bin", b"m" * 3 * 65536,
                layout=LayoutSpec(chunk_size=65536, stripe_count=3))

    def counters(url: str) -> dict[tuple[str, str], float]:
        r = http(url, "GET", "/metrics")
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(r.body.decode())}
        assert "stager_request_seconds" in families
        return {(s.labels["op"], s.labels["status"]): s.value
                for s in families["stager_requests"].samples if s.name.endswith("_total")}

    before = counters(cluster.meta_url)
    for _ in range(3):
        assert http(cluster.meta_url, "GET", f"/v1/stat{ns}/m.bin").status == 200
    assert http(cluster.meta_url, "GET", f"/v1/stat{ns}/none").status == 404
    after = counters(cluster.meta_url)
    assert after[("stat", "200")] - before.get(("stat", "200"), 0) == 3
    assert after[("stat", "404")] - before.get(("stat", "404"), 0) == 1
    assert after.get(("create", "200"), 0) >= 1 and after.get(("commit", "200"), 0) >= 1

    # data servers count chunk requests and bytes per target, and report their usage
    data_url = cluster.data[0].url  # type: ignore[union-attr]
    body = http(data_url, "GET", "/metrics").body.decode()
    families = {f.name: f for f in text_string_to_metric_families(body)}
    received = {s.labels["target"]: s.value for s in families["stager_received_bytes"].samples
                if s.name.endswith("_total")}
    assert received.get(cluster.target_id(0), 0) > 0
    assert families["stager_target_capacity_bytes"].samples[0].value > 0
    assert any(op == "put_chunk" for op, _ in counters(data_url))
    meta_families = {f.name for f in text_string_to_metric_families(
        http(cluster.meta_url, "GET", "/metrics").body.decode())}
    assert {"stager_targets_up", "stager_targets_down"} <= meta_families


def test_health(cluster: ThreadCluster, http) -> None:
    r = http(cluster.meta_url, "GET", "/v1/health")
    assert r.status == 200
    body = r.json()
    assert body["ok"] is True and body["role"] == "meta" and body["version"]
