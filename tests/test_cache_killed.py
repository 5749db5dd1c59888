"""A source killed in the middle of a read (issue 28: "a source killed mid-read gives the
clear error and the cached files still read").

The source is an HTTP server process (``tests/slow_source.py``) that answers a chunk's
ranged GET with its headers and half its bytes, then stalls; the test SIGKILLs it while
the fill is in flight.  The reader gets a 502 ``source_error`` naming the source file,
no chunk of the half-read file is recorded as filled (nothing half-fetched is ever
served as whole: a later read fails again while the source is down, and once it is back
reads every byte as the source has it), and the file cached before reads on.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import raw_http, start_cluster

from stager import Client
from stager.config import load_config
from stager.errors import SourceError, StagerError
from stager.testing import ThreadCluster

KiB = 1024
CHUNK = 64 * KiB
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("killed"), chunk_size=CHUNK, replicas=1)
    yield c
    c.stop()


class Source:
    """``tests/slow_source.py`` as a subprocess: stalls its ranged GETs while ``flag``
    exists."""

    def __init__(self, root: Path, flag: Path, port: int = 0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "slow_source.py"), str(root), str(flag), str(port)],
            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(
                HERE.parent)})
        self.url = self.line(30.0)
        assert self.url.startswith("http://"), self.url

    def line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, "the source said nothing in time"
        return self.proc.stdout.readline().strip()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def test_a_source_killed_during_a_fill_fails_that_read_clearly_and_caches_nothing_of_it(
        cluster: ThreadCluster, tmp_path: Path, ns: str) -> None:
    root, flag = tmp_path / "src", tmp_path / "stall"
    root.mkdir()
    files = {"a.bin": os.urandom(3 * CHUNK + 100), "b.bin": os.urandom(2 * CHUNK)}
    for name, data in files.items():
        (root / name).write_bytes(data)
    path = f"{ns}/web"
    source = Source(root, flag)
    port = int(source.url.rsplit(":", 1)[1])
    client = Client(cluster.meta_url, config=load_config(env={}))
    try:
        client.attach(source.url + "/", path)
        assert client.cat(f"{path}/b.bin") == files["b.bin"]       # cached before
        flag.touch()
        failed: list[BaseException] = []
        got: list[bytes] = []

        def read() -> None:
            try:
                got.append(client.cat(f"{path}/a.bin"))
            except BaseException as exc:        # noqa: BLE001 - handed to the test
                failed.append(exc)
        reader = threading.Thread(target=read)
        started = time.monotonic()
        reader.start()
        assert source.line(60.0) == "stalled a.bin"     # the fill is in flight
        source.kill()
        reader.join(60)
        assert not reader.is_alive()
        assert not got, "a read of a half-fetched file returned bytes"
        [error] = failed
        assert isinstance(error, SourceError), error
        assert error.status == 502
        assert f"{source.url}/a.bin" in str(error)
        assert time.monotonic() - started < 30          # told at once, not at a timeout
        # nothing of a.bin was recorded filled: b's two chunks are the cache
        [shown] = [a for a in client.attachments() if a.path == path]
        assert (shown.cached_chunks, shown.cached_bytes) == (2, 2 * CHUNK)
        # the source is down: a.bin fails again, clearly, through the gateway too
        reply = raw_http(cluster.meta_url, "GET", f"/v1/files{path}/a.bin")
        assert reply.status == 502, reply.body
        assert reply.json()["error"] == "source_error"
        assert "a.bin" in reply.json()["message"]
        with pytest.raises(StagerError):
            client.cat(f"{path}/a.bin")
        assert client.cat(f"{path}/b.bin") == files["b.bin"]       # cached: reads on
        # back up, on the same address: a.bin reads whole, as the source has it
        flag.unlink()
        source = Source(root, flag, port)
        assert client.cat(f"{path}/a.bin") == files["a.bin"]
    finally:
        client.close()
        if source.proc.poll() is None:
            source.kill()
