"""Where the cluster is and how to talk to it is resolved once (``Cluster``) and passed
down; the I/O thread is reached through public seams only."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import fsspec
import pytest
from fsspec.asyn import sync

from stager import AsyncClient, Client, Loader
from stager.client.cluster import Cluster
from stager.config import load_config
from stager.fs import StagerFileSystem
from stager.testing import ThreadCluster

ROOT = Path(__file__).resolve().parent.parent
URLS = "http://meta-a:7070, http://meta-b:7070/"       # never reached: nothing connects
PRIVATE_IO = {"_run", "_schedule"}


def test_resolve_splits_urls_and_applies_the_token_once(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-the-file\n")
    config = load_config(env={}).replace(token_file=str(token_file))
    cluster = Cluster.resolve(URLS, config=config)
    assert cluster.urls == ("http://meta-a:7070", "http://meta-b:7070")
    assert cluster.meta_url == "http://meta-a:7070,http://meta-b:7070"
    assert cluster.headers == {"Authorization": "Bearer from-the-file"}
    token_file.unlink()     # read once: nothing built from the cluster reads it again
    client = Client(cluster=cluster)
    try:
        assert client.aio.meta.headers == {"Authorization": "Bearer from-the-file"}
    finally:
        client.close()
    given = Cluster.resolve(URLS, config=config, token="given")
    assert given.config.token == "given" and given.headers == {"Authorization": "Bearer given"}
    assert Cluster.resolve(config=config.replace(meta_url=URLS), token="given") == given
    assert Cluster.resolve(cluster=given) is given
    with pytest.raises(TypeError):
        Cluster.resolve(URLS, cluster=given)


def test_the_entry_points_resolve_the_same_cluster_and_pass_it_down() -> None:
    config = load_config(env={})
    expected = Cluster.resolve(URLS, config=config, token="t")
    aio = AsyncClient(URLS, config=config, token="t")
    client = Client(URLS, config=config, token="t")
    fs = StagerFileSystem(URLS, config=config, token="t", skip_instance_cache=True)
    try:
        assert aio.cluster == client.cluster == fs.cluster == expected
        assert aio.meta.urls == expected.urls and aio.meta.headers == expected.headers
        assert client.aio.cluster is client.cluster        # passed down, not resolved again

        async def fs_client_cluster() -> Cluster:
            return fs.client.cluster
        assert sync(fs.loop, fs_client_cluster) is fs.cluster
        assert client.meta_url == fs.meta_url == aio.meta_url == expected.meta_url
    finally:
        client.close()
        fs.close()


def test_filesystems_are_cached_by_their_cluster_and_pickle() -> None:
    config = load_config(env={})
    one = Cluster.resolve(URLS, config=config, token="one")
    same = fsspec.filesystem("stager", cluster=one)
    assert fsspec.filesystem("stager", cluster=Cluster.resolve(URLS, config=config,
                                                               token="one")) is same
    other = fsspec.filesystem("stager", cluster=Cluster.resolve(URLS, config=config,
                                                                token="two"))
    assert other is not same and other.cluster.headers == {"Authorization": "Bearer two"}
    by_token = fsspec.filesystem("stager", meta_url=URLS, config=config, token="one")
    assert by_token is not fsspec.filesystem("stager", meta_url=URLS, config=config,
                                             token="two")
    assert by_token.cluster == one
    copy = pickle.loads(pickle.dumps(same))
    assert copy.cluster == one and copy.cluster.headers == one.headers


def test_a_loader_given_a_cluster_keeps_it_when_pickled(cluster: ThreadCluster,
                                                        client: Client, ns: str) -> None:
    for i in range(4):
        client.pipe(f"{ns}/s{i}", bytes([i]) * 10)
    resolved = Cluster.resolve(cluster.meta_url, config=load_config(env={}))
    with Loader(ns, cluster=resolved, batch_size=2, shuffle=False) as loader:
        assert loader._client.cluster is resolved
        with pickle.loads(pickle.dumps(loader)) as copy:
            assert copy._client.cluster == resolved
            assert sum(len(batch) for batch in copy) == 4


# Not callers: a profiler that wraps asyncio's own Handle._run to time each callback.
PROFILERS = {"bench/holds_hook/sitecustomize.py"}


def test_nothing_reaches_into_another_objects_io_thread_helpers() -> None:
    """The sync wrappers, the fs file objects and everything else block on an owner's
    public ``loop`` (``sync(owner.loop, ...)``, ``holder.schedule``), never through
    another object's ``_run``/``_schedule``."""
    reaching = []
    for folder in ("stager", "tests", "bench", "clients"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.relative_to(ROOT).as_posix() in PROFILERS:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Attribute) and node.attr in PRIVATE_IO
                        and not (isinstance(node.value, ast.Name) and node.value.id == "self")):
                    reaching.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not reaching, f"reaching into another object's I/O helpers: {reaching}"
