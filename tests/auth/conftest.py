"""The core, fsspec and Loader tests again, against clusters with auth on.

The test modules here import the tests of ``tests/test_roundtrip.py``,
``tests/test_fs.py`` and ``tests/test_loader.py`` whole; the fixtures below (and,
for fixtures those modules define themselves, the same names defined again
after the import) replace the clusters they run on with ones started with auth (``ThreadCluster``
with ``auth=True``, ``stager up --auth``) and hand every client a token of the
``read`` and ``write`` scopes on ``/`` (not the admin token): through
``STAGER_TOKEN`` for clients the tests make themselves, through ``token=`` for
the fixtures' own, and as ``Authorization: Bearer`` on the raw HTTP requests.
So every request of those tests crosses the auth middleware, and every chunk
request carries a capability.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stager.client import AsyncClient, Client
from stager.config import load_config
from stager.testing.cluster import ThreadCluster

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # the modules copied
from conftest import Reply, _SlowCallbacks, raw_http, start_cluster  # noqa: E402

USER = ["read", "write"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            slow_callbacks: _SlowCallbacks) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("auth-cluster"), auth=True)
    c.user_token = c.mint(USER, name="tests")           # type: ignore[attr-defined]
    with token_in_env(c.user_token):                   # type: ignore[attr-defined]
        yield c
    c.stop()


class token_in_env:
    """``STAGER_TOKEN`` for the module's duration, as a job's environment would have it."""

    def __init__(self, token: str) -> None:
        self.token = token

    def __enter__(self) -> None:
        self.before = os.environ.get("STAGER_TOKEN")
        os.environ["STAGER_TOKEN"] = self.token

    def __exit__(self, *exc: object) -> None:
        if self.before is None:
            os.environ.pop("STAGER_TOKEN", None)
        else:
            os.environ["STAGER_TOKEN"] = self.before


def token_of(cluster: Any) -> str:
    return str(cluster.user_token)


@pytest.fixture
def client(cluster: ThreadCluster) -> Iterator[Client]:
    c = Client(cluster.meta_url, config=load_config(env={}), token=token_of(cluster))
    yield c
    c.close()


@pytest.fixture
async def aclient(cluster: ThreadCluster) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(cluster.meta_url, config=load_config(env={}),
                           token=token_of(cluster)) as c:
        yield c


@pytest.fixture
def http(cluster: ThreadCluster) -> Callable[..., Reply]:
    """Raw HTTP with the token's ``Authorization`` header (unless the test sets one)."""
    def send(base_url: str, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None, timeout: float = 30) -> Reply:
        return raw_http(base_url, method, path, body,
                        {"Authorization": f"Bearer {token_of(cluster)}", **(headers or {})},
                        timeout)
    return send
