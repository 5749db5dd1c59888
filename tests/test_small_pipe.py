"""A small ``pipe`` is one request: the metadata server's PUT creates the file, writes its
chunk through its own data plane and commits it, where a larger one takes three (create,
chunk PUT, commit).  Each answer is the same file as the long way makes it."""

from __future__ import annotations

import pytest
from conftest import meta_requests

from stager import Client
from stager.client.async_client import SMALL_FILE
from stager.protocol.models import LayoutSpec
from stager.testing import ThreadCluster


def grew(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The client's requests between two counts: not the metrics reads themselves, nor
    the data servers' heartbeats, which the test cluster sends often enough to land
    inside the window under load."""
    return {op: n - before.get(op, 0) for op, n in after.items()
            if n != before.get(op, 0) and op not in ("metrics", "heartbeats")}


@pytest.mark.parametrize("size", [0, 1, 1024, SMALL_FILE])
def test_a_small_pipe_is_one_request(client: Client, cluster: ThreadCluster, http, ns: str,
                                     payload, size: int) -> None:
    data = payload(size)
    before = meta_requests(http, cluster)
    info = client.pipe(f"{ns}/s.bin", data)
    assert grew(before, meta_requests(http, cluster)) == {"gateway_put": 1}
    assert (info.size, client.cat(f"{ns}/s.bin")) == (size, data)


def test_a_larger_pipe_creates_writes_and_commits(client: Client, cluster: ThreadCluster,
                                                  http, ns: str, payload) -> None:
    data = payload(SMALL_FILE + 1)
    before = meta_requests(http, cluster)
    client.pipe(f"{ns}/l.bin", data)
    assert grew(before, meta_requests(http, cluster)) == {"create": 1, "commit": 1}
    assert client.cat(f"{ns}/l.bin") == data


def test_a_small_pipe_keeps_the_directorys_layout_and_overwrites(
        client: Client, ns: str, payload) -> None:
    client.mkdir(f"{ns}/r2")
    client.set_layout(f"{ns}/r2", LayoutSpec(chunk_size=1 << 20, stripe_count=2, replicas=2))
    client.pipe(f"{ns}/r2/f.bin", payload(2000))
    info = client.pipe(f"{ns}/r2/f.bin", payload(1000))
    assert (info.layout.chunk_size, info.layout.replicas, info.size) == (1 << 20, 2, 1000)
    assert client.cat(f"{ns}/r2/f.bin") == payload(1000)
