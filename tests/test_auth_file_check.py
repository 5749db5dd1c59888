"""A data server's check of a batch read's files against the request's capabilities.

``require_files`` (stager/web/authmw.py) takes the files each capability grants out
of the files a request wants, a set difference at a time; whatever is left is
checked against every capability and refused, naming the file.  These read over a
real data server: files granted by two batch capabilities, shown together, are read;
one file neither names refuses the whole read.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import raw_http, start_cluster

from stager import Client
from stager.config import load_config
from stager.protocol.models import chunk_id
from stager.testing.cluster import ThreadCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, slow_callbacks: object
            ) -> Iterator[ThreadCluster]:
    c = start_cluster(Path(tmp_path_factory.mktemp("auth-file-check")), auth=True)
    yield c
    c.stop()


def _batch(cluster: ThreadCluster, token: str, file_ids: list[str]) -> str:
    got = raw_http(cluster.meta_url, "POST", "/v1/capabilities",
                   json.dumps({"op": "read", "file_ids": file_ids}).encode(),
                   {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    assert got.status == 200, got.body
    return got.json()["results"][0]["capability"]


def _read(where: str, file_ids: list[str], capabilities: list[str]) -> tuple[int, dict]:
    body = json.dumps({"items": [[chunk_id(f, 0), 0, 1] for f in file_ids]}).encode()
    got = raw_http(where, "POST", "/v1/read", body,
                   {"X-Stager-Capability": " ".join(capabilities),
                    "Content-Type": "application/json"})
    return got.status, (got.json() if got.status != 200 else {})


def test_a_batch_read_needs_every_file_granted(cluster: ThreadCluster, ns: str) -> None:
    token = cluster.mint(["read", "write"])
    with Client(cluster.meta_url, config=load_config(env={}), token=token) as c:
        c.write_many([(f"{ns}/{i}", bytes([i]) * 10) for i in range(16)])
        infos = [c.stat(f"{ns}/{i}") for i in range(16)]
    on: dict[str, list[str]] = defaultdict(list)
    where = {}
    for info in infos:
        target = info.layout.targets[0]
        on[target].append(info.file_id)
        where[target] = info.locations[target]
    target, files = max(on.items(), key=lambda kv: len(kv[1]))
    assert len(files) >= 3
    first, second, outside = files[:1], files[1:-1], files[-1]
    caps = [_batch(cluster, token, first), _batch(cluster, token, second)]
    assert caps[0] != caps[1]
    assert _read(where[target], first + second, caps)[0] == 200     # granted by two
    assert _read(where[target], second, caps[1:])[0] == 200
    status, error = _read(where[target], [*first, outside, *second], caps)
    assert status == 403
    assert outside in json.dumps(error)                    # the refusal names the file
    status, _ = _read(where[target], first + second, caps[1:])    # one of two shown
    assert status == 403
