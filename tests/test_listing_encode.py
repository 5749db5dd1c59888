"""A listing page as the server encodes it (``Listing.wire_json``: each distinct
layout encoded once) is byte for byte the page ``to_json`` encodes to (issue 30)."""

from __future__ import annotations

import json

import pytest

from stager.protocol.messages import Listing
from stager.protocol.models import FileInfo, Layout, LayoutSpec
from stager.web.middleware import encode_json

A = Layout(4 << 20, 2, 1, ("t0", "t1"), ("n0", "n1"))
B = Layout(1 << 20, 1, 1, ("t1",), ("n1",), cached=True)


def info(i: int, layout: Layout | None, path: str = "", **more: object) -> FileInfo:
    return FileInfo(path=path or f"/d/f{i}", type="file", size=i, mtime=1.5 + i,
                    file_id=f"{i:032x}", layout=layout, checksums=(i, 0xFFFFFFFF),
                    locations={"t0": "http://h0:1"} if layout else {}, **more)  # type: ignore[arg-type]


PAGES = [
    Listing("/d", tuple(info(i, A if i % 3 else B) for i in range(10)), "f9"),
    Listing("/d", (info(1, None), FileInfo("/d/sub", "directory",
                                           default_layout=LayoutSpec(chunk_size=1 << 20)),
                   info(2, A, attrs={"etag": "x"}, capability="cap"))),
    Listing("/d", tuple(info(i, A) for i in range(3)), None, detail=False),
    Listing("/", ()),
]


@pytest.mark.parametrize("page", PAGES)
def test_wire_json_encodes_as_to_json(page: Listing) -> None:
    assert encode_json(page.wire_json(), page.to_json) == encode_json(page.to_json())


def test_what_only_json_writes_goes_through_to_json() -> None:
    """A lone surrogate in a name: msgspec refuses it, json escapes it, as before."""
    page = Listing("/d", (info(1, A, path="/d/\udcff"),))
    got = encode_json(page.wire_json(), page.to_json)
    assert got == encode_json(page.to_json())
    assert json.loads(got)["entries"][0]["layout"] == A.to_json()
