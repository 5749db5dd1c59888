"""A stat's answer is written straight from the store's row (issue 30): no NodeEntry, no
FileInfo, no dict, one msgspec encode, as a listing's entries are.  It must be the
object the old path wrote (``MetaService.info(store.stat(path)).to_json()``, with a
read capability for a file when auth is on) for every kind of entry: a file, striped
and replicated with checksums, an empty one, one with attributes, a cached one (no
checksums), one on a target the server does not know (no location), one being
rewritten (the committed version), a directory with and without a default layout,
the root, deep paths; and the same errors."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from conftest import raw_http, start_cluster

from stager.auth import KEY_FILE, load_key
from stager.auth.tokens import verify_capability
from stager.errors import StagerError
from stager.meta.http.app import SERVICE
from stager.meta.service import MetaService
from stager.meta.store.base import Upload
from stager.protocol.models import Layout, LayoutSpec
from stager.testing.cluster import ThreadCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    c = start_cluster(Path(tmp_path_factory.mktemp("stat-answer")), data_servers=2, auth=True)
    try:
        c.wait_targets(2)
        yield c
    finally:
        c.stop()


def service(cluster: ThreadCluster) -> MetaService:
    assert cluster.meta is not None
    return cluster.meta.app[SERVICE]


def put(cluster: ThreadCluster, path: str, layout: Layout, size: int,
        checksums: tuple[int, ...], attrs: dict[str, Any] | None = None,
        commit: bool = True) -> str:
    """A file written straight into the store (any layout, cached or not)."""
    store = service(cluster).store
    file_id = f"{abs(hash((path, time.time_ns()))):032x}"[:32]

    async def write() -> None:
        await store.begin_uploads([Upload(file_id, path, layout, True, True, 1.0)])
        if commit:
            await store.commit_uploads([(file_id, size, checksums, 1.5, attrs or {})],
                                       now=2.0)
    cluster.call(write())
    return file_id


@pytest.fixture(scope="module")
def entries(cluster: ThreadCluster) -> list[str]:
    """The paths of one entry of each kind."""
    targets = tuple(cluster.target_id(i) for i in range(2))
    striped = Layout(1 << 20, 2, 2, targets, ("node0", "node1"))
    svc = service(cluster)
    cluster.call(svc.mkdir("/sa/plain/deep/er", parents=True))
    cluster.call(svc.mkdir("/sa/spec", layout=LayoutSpec(chunk_size=1 << 16, replicas=2)))
    put(cluster, "/sa/striped", striped, 3 << 20, (1, 0xdeadbeef, 0xffffffff))
    put(cluster, "/sa/empty", striped, 0, ())
    put(cluster, "/sa/attrs", striped, 5, (7,), {"etag": '"abc"', "content_type": "x/y"})
    put(cluster, "/sa/cached", replace(striped, cached=True), 5, (7,))
    put(cluster, "/sa/unknown", Layout(1 << 20, 1, 1, ("t-gone",), ("n-gone",)), 1, (2,))
    put(cluster, "/sa/plain/deep/er/f", striped, 9, (3,))
    put(cluster, "/sa/rewritten", striped, 4, (4,))
    put(cluster, "/sa/rewritten", striped, 0, (), commit=False)     # an upload under way
    put(cluster, "/sa/ünï cödé", striped, 1, (5,))
    return ["/", "/sa", "/sa/plain", "/sa/plain/deep/er", "/sa/spec", "/sa/striped",
            "/sa/empty", "/sa/attrs", "/sa/cached", "/sa/unknown", "/sa/plain/deep/er/f",
            "/sa/rewritten", "/sa/ünï cödé"]


def old_answer(cluster: ThreadCluster, path: str) -> dict[str, Any]:
    """What the server wrote before: FileInfo from the store's entry, then its JSON."""
    svc = service(cluster)
    return svc.info(cluster.call(svc.store.stat(path))).to_json()


def stat(cluster: ThreadCluster, path: str, token: str) -> tuple[int, Any]:
    reply = raw_http(cluster.meta_url, "GET", "/v1/stat" + quote(path),
                     headers={"Authorization": f"Bearer {token}"})
    return reply.status, reply.json()


def test_the_answer_is_the_old_one_for_every_kind_of_entry(cluster: ThreadCluster,
                                                           entries: list[str]) -> None:
    token = cluster.mint(["read"])
    key = load_key(cluster.root / "meta" / "auth" / KEY_FILE).public_key()
    kinds = set()
    for path in entries:
        status, got = stat(cluster, path, token)
        assert status == 200, (path, got)
        want = old_answer(cluster, path)
        capability = got.pop("capability", None)
        assert got == want, path
        assert list(got) == list(want), path                # the same order, too
        kinds.add(want["type"])
        if want["type"] == "directory":
            assert capability is None, path
        else:   # a read capability for this file, for the token's holder
            cap = verify_capability(key, capability, time.time())
            assert (cap.file_id, cap.op) == (want["file_id"], "read"), path
    assert kinds == {"file", "directory"}
    # the fields each kind shows or leaves out
    assert "checksums" not in old_answer(cluster, "/sa/cached")
    assert old_answer(cluster, "/sa/empty")["checksums"] == []
    assert old_answer(cluster, "/sa/unknown").get("locations") is None
    assert old_answer(cluster, "/sa/spec")["default_layout"] == {"chunk_size": 1 << 16,
                                                                 "replicas": 2}
    assert old_answer(cluster, "/sa/attrs")["attrs"]["etag"] == '"abc"'
    assert old_answer(cluster, "/sa/rewritten")["size"] == 4


def test_errors_are_the_old_ones(cluster: ThreadCluster, entries: list[str]) -> None:
    token = cluster.mint(["read"])
    store = service(cluster).store
    for path, code in (("/sa/nothing/here", "not_found"),
                       ("/sa/striped/below", "not_a_directory"),
                       ("/sa/plain/deep/er/f/g/h", "not_a_directory")):
        with pytest.raises(StagerError) as old:
            cluster.call(store.stat(path))
        status, body = stat(cluster, path, token)
        assert (status, body) == (old.value.status, old.value.to_json()), path
        assert body["error"] == code
    # a file outside the token's prefixes is refused, as before
    other = cluster.mint(["read"], prefixes=("/elsewhere",))
    status, body = stat(cluster, "/sa/striped", other)
    assert (status, body["error"]) == (403, "forbidden"), body
