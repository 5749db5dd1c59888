"""tests/test_loader.py with auth on, on ``stager up --auth`` (see conftest.py here)."""

from collections.abc import Iterator

import pytest
from test_loader import *  # noqa: F403

from stager.testing.cluster import ProcessCluster

from .conftest import USER, token_in_env

pytestmark = pytest.mark.slow      # stager processes: not in make check


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    c = ProcessCluster(tmp_path_factory.mktemp("auth-loader-cluster"), data_servers=3,
                       auth=True)
    c.start()
    try:
        with token_in_env(c.mint(USER, name="loader tests")):
            yield c
    finally:
        c.stop()
