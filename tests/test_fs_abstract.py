"""fsspec's own conformance suite, run against ``stager://`` the way s3fs runs it."""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Iterator

import fsspec.tests.abstract as abstract
import pytest

from stager.config import load_config
from stager.fs import StagerFileSystem
from stager.testing.cluster import ProcessCluster

pytestmark = pytest.mark.slow      # stager processes: not in make check


@pytest.fixture(scope="module")
def server_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    """The cluster as processes (``stager up``), as s3fs runs the suite against a
    server process: the thousands of small requests do not share this process."""
    with ProcessCluster(tmp_path_factory.mktemp("fsspec-suite"), 3) as cluster:
        yield cluster


class StagerFixtures(abstract.AbstractFixtures):
    @pytest.fixture(scope="class")
    @classmethod
    def fs(cls, server_processes: ProcessCluster) -> Iterator[StagerFileSystem]:
        fs = StagerFileSystem(server_processes.meta_url, config=load_config(env={}),
                              skip_instance_cache=True)
        yield fs
        fs.close()

    @pytest.fixture
    def fs_join(self):  # type: ignore[no-untyped-def]
        return posixpath.join

    @pytest.fixture
    def fs_path(self, fs: StagerFileSystem) -> Iterator[str]:
        path = f"/fsspec-{uuid.uuid4().hex[:10]}"
        yield path
        if fs.exists(path):
            fs.rm(path, recursive=True)

    @pytest.fixture
    def supports_empty_directories(self) -> bool:
        return True          # stager has real directories


class TestStagerCopy(abstract.AbstractCopyTests, StagerFixtures):
    pass


class TestStagerGet(abstract.AbstractGetTests, StagerFixtures):
    pass


class TestStagerPut(abstract.AbstractPutTests, StagerFixtures):
    pass


class TestStagerOpen(abstract.AbstractOpenTests, StagerFixtures):
    pass


class TestStagerPipe(abstract.AbstractPipeTests, StagerFixtures):
    pass
