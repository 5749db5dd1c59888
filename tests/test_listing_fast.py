"""A listing page in one request, one index range and one encode (issue 30).

The server writes a page straight from the store's rows (``stager/meta/listing.py``,
``stager/protocol/listing.py``): byte for byte the page ``Listing.to_json`` of the
rows' FileInfos encodes to.  A page that holds the directory's last entry says so
(``next`` null), so listing a directory of exactly one page is one request, not a
second one for an empty page.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from reliability_util import clocked_service

from stager import Client
from stager.client.listing import listing_from_bytes
from stager.meta.listing import wire_entries
from stager.meta.service import MetaService
from stager.meta.store.base import Listed, NodeEntry
from stager.meta.store.sqlite.listing import SCAN
from stager.meta.store.sqlite.store import SQLiteStore
from stager.protocol.listing import listing_body
from stager.protocol.messages import Listing
from stager.protocol.models import FileInfo, Layout, LayoutSpec
from stager.testing import ThreadCluster
from stager.web.middleware import encode_json

A = Layout(4 << 20, 2, 1, ("t0", "t1"), ("n0", "n1"))
B = Layout(1 << 20, 1, 1, ("t1",), ("n1",), cached=True)
C = Layout(1 << 20, 1, 1, ("gone",), ("n9",))      # a target the service does not know


def file(i: int, layout: Layout, **attrs: object) -> Listed:
    return (f"/d/f{i}", "file", i, 1.5 + i, f"{i:032x}", layout, None,
            (i, 0xFFFFFFFF) if i % 4 else (), dict(attrs))


ROWS: list[list[Listed]] = [
    [file(i, A if i % 3 else B) for i in range(10)],
    [file(1, C), ("/d/sub", "directory", 0, 2.0, None, None, LayoutSpec(chunk_size=1 << 20),
                  None, {}),
     ("/d/empty", "directory", 0, 3.0, None, None, LayoutSpec(), None, {}),
     file(2, A, etag="x", content_type="text/plain")],
    [],
]


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[MetaService]:
    """Two known targets (the rows also name one unknown)."""
    async with clocked_service(tmp_path, 2, lambda i: f"http://127.0.0.1:{i + 1}") as (svc, _):
        yield svc


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("detail", [True, False])
@pytest.mark.parametrize("nxt", [None, "f9"])
async def test_a_page_from_rows_is_the_page_of_their_infos(
        service: MetaService, rows: list[Listed], detail: bool, nxt: str | None) -> None:
    infos = tuple(service.info(NodeEntry(*row)) for row in rows)
    want = encode_json(Listing("/d", infos, nxt, detail=detail).to_json())
    assert listing_body("/d", wire_entries(rows, service.locations), nxt, detail=detail) == want


def test_what_only_json_writes_goes_through_json() -> None:
    """A lone surrogate in a name: msgspec refuses it, json escapes it, as before."""
    rows = [file(1, A)]
    rows[0] = ("/d/\udcff", *rows[0][1:])                     # type: ignore[assignment]
    got = listing_body("/d", wire_entries(rows, lambda layout: {"t0": "http://h:1"}), None)
    entry = json.loads(got)["entries"][0]
    assert entry["path"] == "/d/\udcff" and entry["layout"] == A.to_json()
    assert entry["locations"] == {"t0": "http://h:1"} and entry["checksums"] == ["00000001",
                                                                                "ffffffff"]


async def test_a_page_is_one_range_of_the_name_index(service: MetaService) -> None:
    """No sort and no per-row query: SQLite walks the (parent, name) index in order."""
    store = service.store
    assert isinstance(store, SQLiteStore)
    plan = " | ".join(row[3] for row in store.database.db.execute(
        "EXPLAIN QUERY PLAN " + SCAN, (1, "", 10)))
    assert "USING INDEX" in plan and "(parent=? AND name>?)" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


def test_a_page_holding_the_last_entry_names_no_next(cluster: ThreadCluster, http,
                                                     client: Client, ns: str) -> None:
    for i in range(4):
        client.pipe(f"{ns}/f{i}", b"x")
    whole = http(cluster.meta_url, "GET", f"/v1/list{ns}?limit=4").json()
    assert len(whole["entries"]) == 4 and whole["next"] is None
    page = http(cluster.meta_url, "GET", f"/v1/list{ns}?limit=3").json()
    assert len(page["entries"]) == 3 and page["next"] == "f2"
    last = http(cluster.meta_url, "GET", f"/v1/list{ns}?limit=3&after=f2").json()
    assert [e["path"] for e in last["entries"]] == [f"{ns}/f3"] and last["next"] is None
    assert [e.name for e in client.ls(ns)] == ["f0", "f1", "f2", "f3"]


def test_a_decoded_entry_is_the_fileinfo_its_init_makes() -> None:
    """``listing_from_bytes`` fills each FileInfo's fields without its __init__: the
    same object in every way a caller sees (equal, hashable fields, repr, frozen)."""
    page = Listing("/d", (
        FileInfo("/d/f", "file", 3, 1.5, "ab" * 16, A, None, (1, 2), {"t0": "http://h:1"},
                 "cap", {"etag": "x"}),
        FileInfo("/d/s", "directory", 0, 2.0, default_layout=LayoutSpec(chunk_size=1 << 20))))
    got = listing_from_bytes(encode_json(page.to_json()))
    assert got == page and got.entries == page.entries
    for mine, made in zip(got.entries, page.entries, strict=True):
        assert repr(mine) == repr(made) and vars(mine) == vars(made)
        with pytest.raises(dataclasses.FrozenInstanceError):
            mine.size = 9                                   # type: ignore[misc]
    assert not hasattr(FileInfo, "__post_init__")          # nothing __init__ would run
