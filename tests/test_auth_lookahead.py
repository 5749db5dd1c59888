"""A Loader asks for its capabilities ahead, a few fetch groups' at once, each data
server's files together (stager/loader/fetch.py ``warm_ahead``): a batch capability
names one data server's files (or two servers', where one's end and the next one's
begin), so each server verifies few, and a request carries one or two of them.  Least
privilege is unchanged: a batch still grants reads of exactly the files it names
(tests/test_auth_batch.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import raw_http, start_cluster

from stager import Client
from stager.auth.keys import load_public_key
from stager.auth.tokens import verify_capability
from stager.config import load_config
from stager.loader import Loader
from stager.testing.cluster import ThreadCluster

FILES = 640                 # whole batches of 32


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, slow_callbacks: object
            ) -> Iterator[ThreadCluster]:
    c = start_cluster(Path(tmp_path_factory.mktemp("auth-ahead")), auth=True)
    yield c
    c.stop()


def test_a_loaders_batches_each_name_one_data_servers_files(cluster: ThreadCluster,
                                                          ns: str) -> None:
    token = cluster.mint(["read", "write"], (ns,))
    with Client(cluster.meta_url, config=load_config(env={}), token=token) as c:
        c.write_many([(f"{ns}/d/{i:04d}", i.to_bytes(2, "big")) for i in range(FILES)])
        server_of = {(info := c.stat(f"{ns}/d/{i:04d}")).file_id: info.layout.targets[0]
                     for i in range(FILES)}
    loader = Loader(f"{ns}/d", batch_size=32, meta_url=cluster.meta_url, token=token,
                    format="files", config=load_config(env={}), report=False,
                    prefetch_next_epoch=False)
    try:
        book = loader._client.aio.capabilities
        assert book is not None
        got = sorted(int.from_bytes(s["data"], "big") for b in loader for s in b)
        assert got == list(range(FILES))
        texts = {book.held("read", f) for f in server_of}
        assert None not in texts
        public = load_public_key(raw_http(cluster.meta_url, "GET", "/v1/auth/key")
                                 .json()["public_key"])
        seen: dict[str, set[str]] = {}          # server -> the batches naming its files
        for text in texts:
            cap = verify_capability(public, text, time.time())
            assert cap.op == "read" and cap.files <= set(server_of)
            for f in cap.files:
                seen.setdefault(server_of[f], set()).add(text)
        # Each server's files in as few batches as they fill, give or take the one shared
        # with the server before and after it: a fetch group's own (every server's files
        # of 32 batches' worth) would have made each server verify about 20.
        for server, batches in seen.items():
            mine = sum(1 for s in server_of.values() if s == server)
            assert len(batches) <= mine // 256 + 3, (server, len(batches))
    finally:
        loader.close()
