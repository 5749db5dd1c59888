"""deploy/grafana/stager.json: every metric a panel draws is one the servers export.

The board's PromQL is parsed down to its metric names, and those are compared with
what a real metadata server and real data servers answer on ``GET /metrics`` after
real traffic (a file written and read) and a loader's telemetry report (so the job
gauges exist).  A Prometheus counter ``x`` is scraped as ``x_total``; a histogram
as ``x_bucket``, ``x_sum`` and ``x_count``: the names are compared as scraped.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conftest import raw_http
from prometheus_client.parser import text_string_to_metric_families

from stager import Client
from stager.protocol.models import LayoutSpec
from stager.testing import ThreadCluster
from stager.testing.browser import report_job

BOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "stager.json"

# PromQL's words that are not metric names (functions are followed by "(", so not here)
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
            "or", "unless", "offset", "inf", "nan"}
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
                                                            "_created"),
            "summary": ("_sum", "_count", "_created"), "gauge": ("",)}


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])      # a collapsed row holds its panels


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)        # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)                  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)                 # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ",
                  text)                                     # label lists
    text = re.sub(r"\$\{?\w+\}?", " ", text)                # Grafana variables
    names = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)\s*(\()?", text):
        name, call = m.group(1), m.group(2)
        if not call and name.lower() not in KEYWORDS:
            names.add(name)
    return names


def test_metric_names_are_parsed_from_promql() -> None:
    assert metric_names('histogram_quantile(0.99, sum by (le, op) (rate('
                        'stager_request_seconds_bucket{op!="x"}[$__rate_interval])))') == \
        {"stager_request_seconds_bucket"}
    assert metric_names("max(a_b) / clamp_min(max(c), 1) > bool 0.5") == {"a_b", "c"}
    assert metric_names('sort_desc(x{job=~"a|b"} > 0.1) or on (job) y') == {"x", "y"}


def scraped(url: str) -> set[str]:
    """Every series name ``url``'s /metrics exports: each sample's, and for each
    family declared, the names its type is scraped under (a labelled counter with no
    sample yet is still declared)."""
    reply = raw_http(url, "GET", "/metrics")
    assert reply.status == 200
    body = reply.body.decode()
    names = set()
    for family in text_string_to_metric_families(body):
        names |= {s.name for s in family.samples}
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return names


def test_every_panel_metric_is_exported(tmp_path: Path) -> None:
    board = json.loads(BOARD.read_text())
    assert board["title"] and board["uid"] and board["panels"]
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    used: dict[str, list[str]] = {}
    for panel in panels(board):
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            for name in metric_names(target["expr"]):
                used.setdefault(name, []).append(panel["title"])
    # what the issue asks the board to show
    assert {"stager_sent_bytes_total", "stager_received_bytes_total",
            "stager_request_seconds_bucket", "stager_cluster_capacity_bytes",
            "stager_rebuild_bytes_remaining", "stager_job_stall_fraction"} <= set(used)
    assert any("histogram_quantile" in t["expr"] and "stager_request_seconds_bucket" in t["expr"]
               for p in panels(board) for t in p.get("targets", []))

    cluster = ThreadCluster(tmp_path, 2)
    cluster.start()
    try:
        cluster.wait_targets(2)
        with Client(cluster.meta_url) as client:     # bytes through both data servers
            client.pipe("/g/f.bin", b"g" * 4 * 65536,
                        layout=LayoutSpec(chunk_size=65536, stripe_count=2))
            assert client.cat("/g/f.bin") == b"g" * 4 * 65536
        report_job(cluster.meta_url, "grafana-job", 0, stall_fraction=0.4,
                   samples_per_second=10.0)
        time.sleep(0.5)         # two heartbeats at least: the per-target rates exist
        exported = scraped(cluster.meta_url)
        for server in cluster.data:
            assert server is not None
            exported |= scraped(server.url)
    finally:
        cluster.stop()
    missing = {name: titles for name, titles in used.items() if name not in exported}
    assert not missing, f"panels draw metrics no server exports: {missing}"
