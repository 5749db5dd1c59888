"""Plan-aware eviction on a real cluster (issue 28, item 4): a Loader over an attached
dataset registers its epoch plan (the parameters and the sample extents); the metadata
server derives every rank's reads with the Loader's own functions, evicts the chunk
read furthest ahead, and fills ahead of the job.  Over two shuffled epochs of a
dataset 1.5 times the cache, the source is asked less than under LRU."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import raw_http, start_cluster
from fsspec.asyn import sync

from stager import Client, Loader
from stager.cli.main import main
from stager.client.warm import PlanSpec
from stager.config import load_config
from stager.loader.warmplan import plan_order
from stager.meta.http.cache import CACHE
from stager.plans.registered import plan_id
from stager.testing import ThreadCluster
from stager.testing.countingsource import CountingSource

pytestmark = pytest.mark.slow      # a cluster per policy, a Loader a rank: not in make check

KiB = 1024
CHUNK = 64 * KiB
FILES = 48
LIMIT = 32 * CHUNK           # 2 MiB: the dataset is 1.5 times it


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CountingSource,
                                                                       dict[str, bytes]]]:
    root = tmp_path_factory.mktemp("src")
    files = {f"s{i:03d}.bin": os.urandom(CHUNK) for i in range(FILES)}
    for name, data in files.items():
        (root / name).write_bytes(data)
    server = CountingSource(root).start()
    yield server, files
    server.close()


def two_epochs(tmp: Path, policy: str, server: CountingSource, files: dict[str, bytes]
               ) -> tuple[int, ThreadCluster]:
    """Source GETs of two epochs by ranks 0 and 1 under ``policy`` (a cluster of its own)."""
    cluster = start_cluster(tmp / policy, chunk_size=CHUNK, replicas=1, cache_limit=LIMIT,
                            cache_policy=policy, cache_interval=0.1)
    client = Client(cluster.meta_url, config=load_config(env={}))
    client.attach(server.url + "/", "/data")
    before = sum(server.gets.values())
    # each rank's batches of one step go together: the ranks run in step, as in training
    step = [threading.Barrier(2) for _ in range(2)]

    def rank(r: int) -> None:
        with Loader("/data", meta_url=cluster.meta_url, batch_size=2, rank=r, world_size=2,
                    seed=3, index_cache=tmp / f"{policy}{r}", prefetch_next_epoch=False
                    ) as loader:
            for epoch in (0, 1):
                loader.set_epoch(epoch)
                for batch in loader:
                    step[epoch].wait(30)
                    assert all(s["data"] == files[s["__key__"]] for s in batch)
                    time.sleep(0.03)        # the training step

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    client.close()
    return sum(server.gets.values()) - before, cluster


def test_plan_aware_eviction_asks_the_source_less_than_lru(
        tmp_path: Path, source: tuple[CountingSource, dict[str, bytes]]) -> None:
    server, files = source
    lru, c1 = two_epochs(tmp_path, "lru", server, files)
    c1.stop()
    plan, c2 = two_epochs(tmp_path, "plan", server, files)
    try:
        book = c2.meta.app[CACHE].plans          # type: ignore[union-attr]
        assert len(c2.call(book.current())) == 1          # the Loader's plan is live
        # while it is, a fill that finds the cache full frees down to the high watermark
        # only (30 of 32 chunks), not the low one (27): what it frees, the plan reads
        with Client(c2.meta_url, config=load_config(env={})) as client:
            for name in sorted(files):
                client.cat(f"/data/{name}")
                [a] = client.attachments()
                assert a.cached_bytes <= LIMIT
                assert a.cached_bytes >= 29 * CHUNK, (name, a.cached_bytes // CHUNK)
    finally:
        c2.stop()
    assert lru >= FILES and plan >= FILES           # the first epoch fetches everything
    # the second epoch: LRU refetches most of it, the plan keeps what is read soonest
    assert plan < lru, (plan, lru)


def test_a_plan_is_checked_and_is_its_registrants_own(tmp_path: Path) -> None:
    with ThreadCluster(tmp_path / "c", 2, auth=True) as c:
        src = tmp_path / "src"
        src.mkdir()
        (src / "a.bin").write_bytes(b"a" * 1000)
        admin = Client(c.meta_url, config=load_config(env={}), token=c.admin_token)
        admin.attach(f"file://{src}", "/team/view")
        file_id = admin.stat("/team/view/a.bin").file_id
        admin.close()
        mine, other = c.mint(["read"], ("/team",)), c.mint(["read"], ("/other",))
        dataset = {"files": [file_id], "chunk_sizes": [CHUNK], "samples": 1, "sample": [0],
                   "file": [0], "offset": [0], "length": [1000]}
        plan = {"seed": 1, "epoch": 0, "world_size": 1, "batch_size": 1, "window": 1}
        pid = plan_id("x")

        def send(method: str, path: str, body: object, token: str) -> tuple[int, dict]:
            reply = raw_http(c.meta_url, method, path, json.dumps(body).encode(), headers={
                "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            return reply.status, reply.json()

        good = {"plan": plan, "dataset": dataset, "epoch": 0, "cursor": 0}
        assert send("PUT", f"/v1/plans/{pid}", good, other)[0] == 403   # may not read it
        status, body = send("PUT", f"/v1/plans/{pid}", good, mine)
        assert status == 200 and body["files"] == 1
        assert send("POST", f"/v1/plans/{pid}/position", {"epoch": 0, "cursor": 1},
                    mine)[0] == 200
        assert send("POST", f"/v1/plans/{pid}/position", {"epoch": 0, "cursor": 1},
                    other)[0] == 403                                    # not its plan
        assert send("PUT", f"/v1/plans/{pid}", good, other)[0] == 403
        assert send("POST", f"/v1/plans/{plan_id('y')}/position", {"epoch": 0, "cursor": 0},
                    mine)[0] == 404
        status, body = send("PUT", f"/v1/plans/{pid}", {**good, "plan": {**plan, "seed": -1,
                                                                         "window": 0}}, mine)
        assert status == 400 and body["details"]["field"] == "window"
        status, body = send("PUT", f"/v1/plans/{pid}", {**good, "dataset": {"files": 3}}, mine)
        assert status == 400 and body["error"] == "bad_request"
        assert send("PUT", "/v1/plans/not-hex", good, mine)[0] == 400


def test_warm_by_a_plan_fills_first_what_the_loader_reads_first(
        tmp_path: Path, source: tuple[CountingSource, dict[str, bytes]]) -> None:
    server, files = source
    with ThreadCluster(tmp_path / "c", 2, chunk_size=CHUNK) as c:
        client = Client(c.meta_url, config=load_config(env={}))
        client.attach(server.url + "/", "/data")
        spec = PlanSpec.parse("seed=5,world=2,epoch=1,batch=3")
        order = sync(client.loop, plan_order, client.aio, "/data", spec)
        assert sorted(f.name for f, _ in order) == sorted(files)     # each chunk once
        first: list[str] = []
        for r in (0, 1):
            with Loader("/data", meta_url=c.meta_url, batch_size=3, rank=r, world_size=2,
                        seed=5, drop_last=False, index_cache=tmp_path / f"i{r}") as loader:
                loader.set_epoch(1)
                first += [s["__key__"] for s in next(iter(loader))]
        assert {f.name for f, _ in order[:6]} == set(first)
        done = main(["--meta", c.meta_url, "warm", "/data", "--plan",
                     "seed=5,world=2,epoch=1,batch=3", "--progress", "never"])
        assert done == 0
        assert [a.cached_bytes for a in client.attachments()] == [FILES * CHUNK]
        client.close()
