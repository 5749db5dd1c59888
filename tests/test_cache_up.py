"""``stager up --cache-limit BYTES`` and ``stager job up --cache-limit BYTES`` (issue 28,
item 3): the flag reaches the metadata server's ``cache_limit`` (``stager meta
--cache-limit``), so a cluster started with it keeps the bytes filled into attached
directories under the limit while a dataset larger than it is read, twice, byte-exact.
A limit that is not a size is refused by ``stager up`` itself, in one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stager import Client
from stager.config import load_config
from stager.testing import ProcessCluster
from stager.testing.cachewatch import FilledWatch
from stager.testing.jobnodes import EmulatedJob

# `stager up` and `stager job up` in subprocesses; the job's module group, as
# tests/test_jobcluster.py says why
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]

KiB = 1024
CHUNK = 64 * KiB
LIMIT = 1024 * KiB
FILES = 24                      # one-chunk files: 1.5 MiB, 1.5 times the limit


def dataset(root: Path) -> dict[str, bytes]:
    root.mkdir(parents=True)
    files = {f"s{i:02d}.bin": os.urandom(CHUNK) for i in range(FILES)}
    for name, data in files.items():
        (root / name).write_bytes(data)
    return files


def read_twice_under_the_limit(client: Client, src: Path, files: dict[str, bytes]) -> None:
    """Attach ``src``, read every file twice: byte-exact, the filled bytes never past
    the limit, and the second pass fetched again what the first evicted."""
    client.attach(f"file://{src}", "/ds")
    with FilledWatch(client) as watch:
        for _ in range(2):
            for name, data in files.items():
                assert client.cat(f"/ds/{name}") == data, name
    [usage] = client.attachments()
    assert 0 < watch.most <= LIMIT, watch.most
    assert usage.cached_bytes <= LIMIT
    assert usage.misses > FILES             # evicted in the first pass, fetched again


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[ProcessCluster]:
    with ProcessCluster(tmp_path / "c", data_servers=2,
                        env={"STAGER_CACHE_INTERVAL": "0.2"},
                        up_args=["--chunk-size", "64KiB", "--cache-limit", "1MiB"]) as c:
        yield c


def test_stager_up_cache_limit_keeps_filled_bytes_under_it(
        limited: ProcessCluster, tmp_path: Path) -> None:
    files = dataset(tmp_path / "src")
    with Client(limited.meta_url, config=load_config(env={})) as client:
        read_twice_under_the_limit(client, tmp_path / "src", files)
        # once idle, the duty holder's rounds keep it under the high watermark (0.95):
        # past it they evict down to the low one (0.85)
        deadline = time.monotonic() + 15
        while client.attachments()[0].cached_bytes > LIMIT * 0.95 and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.attachments()[0].cached_bytes <= LIMIT * 0.95


def test_stager_up_refuses_a_cache_limit_that_is_not_a_size(tmp_path: Path) -> None:
    up = subprocess.run([sys.executable, "-m", "stager", "up", "--root", str(tmp_path / "r"),
                         "--port", "0", "--data-servers", "1", "--cache-limit", "lots"],
                        capture_output=True, text=True, timeout=60)
    assert up.returncode == 1
    assert up.stderr.strip() == "stager up: not a size: 'lots'", up.stderr
    assert not (tmp_path / "r" / "meta").exists()       # no server was started


def test_stager_job_up_cache_limit_reaches_the_job_s_metadata_server(tmp_path: Path) -> None:
    files = dataset(tmp_path / "shared" / "src")
    with EmulatedJob(tmp_path / "job", nodes=1, mode="loopback", job_id="2801") as job:
        job.step(["job", "up", "--insecure", "--quiet", "--chunk-size", "64KiB",
                  "--cache-limit", "1MiB"])
        try:
            with Client(job.cluster()["meta"]["url"], config=load_config(env={})) as client:
                read_twice_under_the_limit(client, tmp_path / "shared" / "src", files)
        finally:
            job.step(["job", "down", "--quiet"])
        assert job.leftovers() == ([], [])
