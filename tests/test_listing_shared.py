"""A listing page that sends each layout once (``layouts=shared``, issue 30).

The layouts and their targets' URLs, repeated in every entry, were most of a page's
bytes and half its decoding.  A shared page holds each once, in ``layouts``, and
each entry names its by index.  It reads as exactly the FileInfos of the page
without it, and without the parameter a page is what it always was.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import STORES, cluster_on_each_store
from reliability_util import clocked_service
from test_listing_decode import CASES, LAYOUT
from test_listing_fast import ROWS, A, file

from stager import Client
from stager.client.listing import listing_from_bytes, listing_of
from stager.errors import BadRequest
from stager.meta.listing import wire_entries
from stager.meta.service import MetaService
from stager.protocol.listing import listing_body, unshared
from stager.protocol.messages import Listing
from stager.testing import ThreadCluster

_cluster = pytest.fixture(scope="module", params=STORES, name="cluster")(cluster_on_each_store)


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[MetaService]:
    """Two known targets (the rows also name one unknown)."""
    async with clocked_service(tmp_path, 2, lambda i: f"http://127.0.0.1:{i + 1}") as (svc, _):
        yield svc


def pages(svc: MetaService, rows: Any, nxt: str | None, detail: bool = True
          ) -> tuple[bytes, bytes]:
    """The page of ``rows`` without and with shared layouts."""
    plain = listing_body("/d", wire_entries(rows, svc.locations), nxt, detail=detail)
    layouts: list[msgspec.Raw] = []
    shared = listing_body("/d", wire_entries(rows, svc.locations, layouts), nxt,
                          detail=detail, layouts=layouts)
    return plain, shared


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("detail", [True, False])
async def test_a_shared_page_reads_as_the_page_without_it(
        service: MetaService, rows: Any, detail: bool) -> None:
    plain, shared = pages(service, rows, "f9", detail)
    assert unshared(json.loads(shared)) == json.loads(plain)
    got, want = listing_from_bytes(shared), listing_from_bytes(plain)
    assert got == want and got.entries == want.entries
    assert listing_of(json.loads(shared)) == want
    for mine, made in zip(got.entries, want.entries, strict=True):
        assert vars(mine) == vars(made)
    if rows is ROWS[0] and detail:             # ten entries of two layouts
        assert len(shared) < len(plain)


async def test_each_layout_is_sent_once_and_shared(service: MetaService) -> None:
    rows = ROWS[0]                      # ten files of two layouts, A and B
    _, shared = pages(service, rows, None)
    page = json.loads(shared)
    assert list(page) == ["path", "layouts", "entries", "next"]
    assert len(page["layouts"]) == 2 and "locations" in page["layouts"][0]
    assert {e["layout"] for e in page["entries"]} == {0, 1}
    assert not any("locations" in e for e in page["entries"])
    got = listing_from_bytes(shared)
    assert len({id(e.layout) for e in got.entries}) == 2
    assert len({id(e.locations) for e in got.entries}) == 2


def test_what_only_json_writes_is_a_shared_page_too() -> None:
    """A lone surrogate in a name: msgspec refuses it, json writes the same page."""
    rows = [file(1, A), ("/d/\udcff", *file(2, A)[1:])]
    layouts: list[msgspec.Raw] = []
    got = json.loads(listing_body("/d", wire_entries(rows, lambda _: {"t0": "http://h:1"},
                                                     layouts), None, layouts=layouts))
    assert got["layouts"] == [{**A.to_json(), "locations": {"t0": "http://h:1"}}]
    assert [e["layout"] for e in got["entries"]] == [0, 0]


def share(obj: Any) -> Any:
    """``obj`` as a shared page: each entry's layout (and its locations) in ``layouts``."""
    if not isinstance(obj, dict) or type(obj.get("entries")) is not list:
        return obj
    layouts: dict[str, int] = {}        # by its JSON text: True == 1, but not as JSON
    entries = []
    for e in obj["entries"]:
        if type(e) is dict and type(e.get("layout")) is dict:
            shared = {**e["layout"], **({"locations": e["locations"]} if "locations" in e
                                        else {})}
            e = {k: v for k, v in e.items() if k != "locations"}
            e["layout"] = layouts.setdefault(json.dumps(shared), len(layouts))
        entries.append(e)
    return {**obj, "layouts": [json.loads(k) for k in layouts], "entries": entries}


def outcome(fn: Any, obj: Any) -> Any:
    try:
        return fn(obj)
    except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
        return type(exc), str(exc)


def entry(i: int, **fields: Any) -> dict[str, Any]:
    return {"path": f"/d/f{i}", "type": "file", "size": i, "mtime": 1.5, "layout": 0,
            "checksums": [], **fields}


ODD = [
    {"path": "/d", "layouts": [LAYOUT], "entries": [entry(1, layout=1)]},      # no layout 1
    {"path": "/d", "layouts": [LAYOUT], "entries": [entry(1, layout=-1)]},
    {"path": "/d", "layouts": [LAYOUT], "entries": [entry(1, layout=True)]},   # not an index
    {"path": "/d", "layouts": [], "entries": [entry(1)]},
    {"path": "/d", "layouts": {"0": LAYOUT}, "entries": [entry(1)]},
    {"path": "/d", "layouts": [5], "entries": [entry(1)]},
    {"path": "/d", "layouts": None, "entries": [entry(1)]},
    {"path": "/d", "layouts": [{**LAYOUT, "locations": ["x"]}], "entries": [entry(1)]},
    {"path": "/d", "layouts": [{**LAYOUT, "locations": {"t0": "http://h:1"}}],
     "entries": [entry(1, locations={"t1": "http://h:2"}), entry(2, locations={})]},
    {"path": "/d", "layouts": [{**LAYOUT, "stripe_count": 3}], "entries": [entry(1)]},
    {"path": "/d", "layouts": [LAYOUT], "entries": 5},
    {"path": "/d", "layouts": [LAYOUT], "entries": [entry(1, layout=LAYOUT), entry(2)]},
    {"path": "/d", "entries": [entry(1)]},                  # an index on a page without
]


@pytest.mark.parametrize("obj", [share(c) for c in CASES] + ODD)
def test_the_quick_reader_reads_a_shared_page_as_unshared_says(obj: Any) -> None:
    """What ``Listing.from_json`` makes of the page :func:`unshared` stands it for: the
    same Listing, or the same error, by the typed reader of the bytes and by
    :func:`listing_of`."""
    want = outcome(lambda o: Listing.from_json(unshared(o)), copy.deepcopy(obj))
    assert outcome(listing_of, copy.deepcopy(obj)) == want
    assert outcome(listing_from_bytes, json.dumps(obj).encode()) == want


def names_an_index(case: Any) -> bool:
    return isinstance(case, dict) and type(case.get("entries")) is list and any(
        type(e) is dict and type(e.get("layout")) is int for e in case["entries"])


def test_share_and_unshared_undo_each_other() -> None:
    """The cases above stand for the pages they were made from (but where an entry's
    layout was a number: in a shared page that is an index)."""
    for case in CASES:
        if names_an_index(case):
            continue
        assert outcome(lambda o: Listing.from_json(unshared(share(o))), copy.deepcopy(case)) \
            == outcome(Listing.from_json, copy.deepcopy(case))
    with pytest.raises(BadRequest, match="the page has 1 layouts"):
        unshared(ODD[0])


def test_the_server_sends_shared_pages_to_who_asks(cluster: ThreadCluster, http,
                                                   client: Client, ns: str) -> None:
    for i in range(5):
        client.pipe(f"{ns}/f{i}", b"x" * i)
    client.mkdir(f"{ns}/sub")
    plain = http(cluster.meta_url, "GET", f"/v1/list{ns}?limit=4")
    shared = http(cluster.meta_url, "GET", f"/v1/list{ns}?limit=4&layouts=shared")
    assert plain.status == shared.status == 200
    assert "layouts" not in plain.json()
    assert len(shared.json()["layouts"]) >= 1 and len(shared.body) < len(plain.body)
    assert listing_from_bytes(shared.body) == listing_from_bytes(plain.body)
    bare = http(cluster.meta_url, "GET", f"/v1/list{ns}?detail=false&layouts=shared").json()
    assert bare["layouts"] == [] and all(set(e) == {"path", "type"} for e in bare["entries"])
    bad = http(cluster.meta_url, "GET", f"/v1/list{ns}?layouts=each")
    assert bad.status == 400 and bad.json()["error"] == "bad_request"
    assert "layouts" in bad.json()["message"]
    # the client asks for shared pages: what it lists is the unshared pages' entries
    whole = listing_from_bytes(http(cluster.meta_url, "GET", f"/v1/list{ns}").body)
    assert tuple(client.ls(ns)) == whole.entries
