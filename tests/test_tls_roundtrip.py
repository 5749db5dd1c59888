"""The core round trips of ``tests/test_roundtrip.py`` again, every server over HTTPS.

The tests are the same functions (imported, so they cannot drift apart); only
the fixtures differ: the cluster serves TLS with a private CA under its root,
and every client (those the tests make themselves included, through
``STAGER_CA_FILE``) trusts that CA.
"""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from conftest import Reply, raw_http, start_cluster
from test_roundtrip import *  # noqa: F403 - the tests themselves, collected here again

from stager import AsyncClient, Client
from stager.auth.tls import client_context
from stager.config import load_config
from stager.testing import ThreadCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("tls-cluster"), tls=True)
    before = os.environ.get("STAGER_CA_FILE")
    os.environ["STAGER_CA_FILE"] = c.config.ca_file   # clients made with the defaults
    try:
        assert c.meta_url.startswith("https://")
        yield c
    finally:
        if before is None:
            os.environ.pop("STAGER_CA_FILE", None)
        else:
            os.environ["STAGER_CA_FILE"] = before
        c.stop()


@pytest.fixture
def client(cluster: ThreadCluster) -> Iterator[Client]:
    c = Client(cluster.meta_url, config=load_config({"ca_file": cluster.config.ca_file},
                                                    env={}))
    yield c
    c.close()


@pytest.fixture
async def aclient(cluster: ThreadCluster) -> AsyncIterator[AsyncClient]:
    config = load_config({"ca_file": cluster.config.ca_file}, env={})
    async with AsyncClient(cluster.meta_url, config=config) as c:
        yield c


@pytest.fixture
def http(cluster: ThreadCluster) -> Callable[..., Reply]:
    """The conftest's raw exchange, over HTTPS trusting the cluster's CA."""
    return functools.partial(raw_http, context=client_context(cluster.config.ca_file))
