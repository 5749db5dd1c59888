"""tests/test_fs.py (the fsspec filesystem) with auth on (see conftest.py here)."""

from collections.abc import Iterator

import pytest
from test_fs import *  # noqa: F403

from stager.config import load_config
from stager.fs import StagerFileSystem
from stager.testing.cluster import ThreadCluster

from .conftest import token_of


@pytest.fixture(scope="module")
def fs(cluster: ThreadCluster) -> Iterator[StagerFileSystem]:
    fs = StagerFileSystem(cluster.meta_url, config=load_config(env={}), token=token_of(cluster),
                          skip_instance_cache=True)
    yield fs
    fs.close()
