"""The client's quick page reader (stager/client/listing.py) answers exactly what
``Listing.from_json`` answers: the same Listing, or the same error."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from stager.client.listing import info_from_bytes, listing_from_bytes, listing_of
from stager.protocol.messages import Listing
from stager.protocol.models import FileInfo

LAYOUT = {"chunk_size": 4194304, "stripe_count": 2, "replicas": 1, "targets": ["t0", "t1"],
          "nodes": ["n0", "n1"]}


def entry(i: int, **fields: Any) -> dict[str, Any]:
    out = {"path": f"/d/f{i:04d}", "type": "file", "size": i, "mtime": 1733540000.5 + i,
           "file_id": f"{i:032x}", "layout": copy.deepcopy(LAYOUT), "checksums": ["0000abcd"],
           "locations": {"t0": "http://h0:1", "t1": "http://h1:1"}}
    out.update(fields)
    return {k: v for k, v in out.items() if v is not ...}


def page(*entries: Any, **fields: Any) -> dict[str, Any]:
    return {"path": "/d", "entries": list(entries), "next": None, **fields}


def outcome(fn: Any, obj: Any) -> Any:
    try:
        return fn(obj)
    except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
        return type(exc), str(exc)


ODD_LAYOUTS = [
    {**LAYOUT, "stripe_count": 3},                     # != len(targets)
    {**LAYOUT, "chunk_size": True},                    # a bool is not a size
    {**LAYOUT, "chunk_size": "4194304"},
    {**LAYOUT, "chunk_size": 0},
    {**LAYOUT, "targets": ["t0", 1]},
    {**LAYOUT, "targets": [["t0"], "t1"]},             # unhashable inside
    {**LAYOUT, "nodes": ["n0"]},
    {**LAYOUT, "cached": True},
    {**LAYOUT, "cached": 1},
    {**LAYOUT, "replicas": True},                      # == 1, the replicas of LAYOUT
    {**LAYOUT, "extra": 1},
    {k: v for k, v in LAYOUT.items() if k != "replicas"},
    [1, 2], "layout", 5,
]

CASES = [
    page(*(entry(i) for i in range(20))),
    page(entry(1), entry(2, size=None, mtime=None, file_id=None, checksums=None, layout=None,
                         locations=None)),
    page(entry(1, size=..., mtime=..., file_id=..., checksums=..., locations=...)),
    page(entry(1, type="directory", layout=..., default_layout={"chunk_size": 1048576})),
    page(entry(1, attrs={"etag": "x"}), entry(2, capability="cap")),
    page(entry(1, size=-1)), page(entry(1, size=True)), page(entry(1, size=2 ** 63)),
    page(entry(1, size=1.5)), page(entry(1, mtime=True)), page(entry(1, mtime=3)),
    page(entry(1, mtime="3")), page(entry(1, path=None)), page(entry(1, path=5)),
    page(entry(1, type=...)), page(entry(1, file_id=7)), page(entry(1, checksums="ab")),
    page(entry(1, checksums=["zz"])), page(entry(1, checksums=[5])),
    page(entry(1, locations=["t0"])), page(entry(1, locations={})),
    page(entry(1, unknown=1)), page(5), page([entry(1)]),
    page(entry(1), path=None), page(entry(1), next="f0001"), page(entry(1), next=3),
    {"path": "/d", "entries": None}, {"path": "/d"}, [page(entry(1))], None,
    page(entry(1, size=None, path=None), path=5),
    *(page(entry(1), entry(2, layout=odd), entry(3, layout=odd)) for odd in ODD_LAYOUTS),
    # a layout refused first, then one that is fine, then the refused one again
    page(entry(1, layout={**LAYOUT, "chunk_size": True}), entry(2),
         entry(3, layout={**LAYOUT, "chunk_size": True})),
    page(entry(1), entry(2, layout={**LAYOUT, "chunk_size": True})),
    page(entry(1, layout={**LAYOUT, "cached": True}), entry(2, layout={**LAYOUT, "cached": 1})),
    # what the typed decoder of the bytes reads differently from a dict, or refuses
    page(entry(1, locations={"t0": 5}), entry(2, attrs=None, capability=None)),
    page(entry(1, default_layout={}), entry(2, layout={**LAYOUT, "cached": False})),
    page(entry(1, type="directory", layout=..., default_layout={"chunk_size": 3})),
    page(entry(1, attrs={"big": "x" * 9000})), page(entry(1, attrs=[1])),
    page(entry(1, mtime=1e308), entry(2, size=2 ** 63 - 1), entry(3, checksums=[])),
]


@pytest.mark.parametrize("obj", CASES)
def test_the_same_as_from_json(obj: Any) -> None:
    assert outcome(listing_of, copy.deepcopy(obj)) == outcome(Listing.from_json,
                                                              copy.deepcopy(obj))


def test_entries_of_one_layout_share_it() -> None:
    got = listing_of(page(*(entry(i) for i in range(5))))
    assert len({id(e.layout) for e in got.entries}) == 1
    assert got == Listing.from_json(page(*(entry(i) for i in range(5))))


@pytest.mark.parametrize("obj", CASES)
def test_from_bytes_the_same_as_from_json(obj: Any) -> None:
    """The typed decoder of a page's bytes (its fallback included) answers the same."""
    assert outcome(listing_from_bytes, json.dumps(obj).encode()) == outcome(
        Listing.from_json, copy.deepcopy(obj))


def test_from_bytes_shares_layouts_and_refuses_what_is_not_json() -> None:
    raw = json.dumps(page(*(entry(i) for i in range(5)))).encode()
    got = listing_from_bytes(raw)
    assert len({id(e.layout) for e in got.entries}) == 1
    assert got == Listing.from_json(json.loads(raw))
    with pytest.raises(ValueError):
        listing_from_bytes(b"{not json")


ENTRIES = [e for c in CASES if isinstance(c, dict) and isinstance(c.get("entries"), list)
           for e in c["entries"]] + [5, None, [1], "x"]


@pytest.mark.parametrize("obj", ENTRIES)
def test_a_stat_from_bytes_the_same_as_from_json(obj: Any) -> None:
    assert outcome(info_from_bytes, json.dumps(obj).encode()) == outcome(
        FileInfo.from_json, copy.deepcopy(obj))


def test_stats_of_one_layout_share_it() -> None:
    one, two = (info_from_bytes(json.dumps(entry(i)).encode()) for i in (1, 2))
    assert one.layout is two.layout and one.layout == FileInfo.from_json(entry(1)).layout
