"""The baselines stager is measured against, each the best its tool does here.

* nginx serving a directory (``sendfile on``), started from a config file this
  module writes, listening only on a loopback or emulated-node address;
* fsspec's HTTP filesystem and plain aiohttp ranged GETs reading from it;
* a plain read of a local file from the page cache;
* one TCP stream over loopback: ``iperf3`` (C) and a Python socket pair.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from .common import MiB

NGINX_CONF = """\
daemon off;
master_process on;
worker_processes {workers};
user root;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    default_type application/octet-stream;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    server {{
        listen {address}:{port};
        root {root};
        location / {{ {location}}}
    }}
}}
"""

Spawn = Callable[[list[str]], subprocess.Popen[bytes]]


def nginx_missing() -> str | None:
    return None if shutil.which("nginx") else "nginx not installed (apt-get install nginx-light)"


class Nginx:
    """nginx serving ``root`` at ``http://address:port``.

    ``spawn`` starts the command (e.g. inside a node's namespace with
    :meth:`stager.testing.nodes.NodeCluster.popen_in`); by default a plain subprocess.
    """

    def __init__(self, root: Path, prefix: Path, *, address: str = "127.0.0.1",
                 port: int = 0, workers: str = "auto", spawn: Spawn | None = None,
                 autoindex: bool = False) -> None:
        self.root, self.prefix = root, prefix
        self.autoindex = autoindex        # directory pages (for fsspec's HTTP listing)
        self.address = address
        self.port = port or _free_port(address)
        self.workers = workers
        self.spawn = spawn
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def __enter__(self) -> Nginx:
        self.prefix.mkdir(parents=True, exist_ok=True)
        conf = self.prefix / "nginx.conf"
        conf.write_text(NGINX_CONF.format(workers=self.workers, prefix=self.prefix,
                                          address=self.address, port=self.port,
                                          root=self.root,
                                          location="autoindex on; " if self.autoindex else ""))
        argv = ["nginx", "-c", str(conf), "-p", str(self.prefix), "-e",
                str(self.prefix / "error.log")]
        if self.spawn is not None:
            self.proc = self.spawn(argv)
        else:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
        self._wait()
        return self

    def _wait(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                log = (self.prefix / "error.log")
                raise RuntimeError(f"nginx exited: {log.read_text() if log.exists() else ''}")
            try:
                with socket.create_connection((self.address, self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not start")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()   # SIGTERM: fast shutdown of master and workers
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


# -- readers of an HTTP URL --------------------------------------------------------------
def fsspec_cat(url: str) -> int:
    """One whole-file GET through fsspec's HTTP filesystem; returns bytes."""
    import fsspec

    fs = fsspec.filesystem("http", skip_instance_cache=True)
    return len(fs.cat_file(url))


def fsspec_sequential(url: str, piece: int = 8 * MiB) -> int:
    """``open()`` then ``read(piece)`` until the end: fsspec's default block cache."""
    import fsspec

    return open_read(fsspec.filesystem("http", skip_instance_cache=True), url, piece)


def open_read(fs: Any, path: str, piece: int = 8 * MiB) -> int:
    """Read a file front to back as a pandas or pyarrow user does through any fsspec
    filesystem: ``open()``, then ``read(piece)`` until the end; returns bytes read."""
    n = 0
    with fs.open(path, "rb") as fh:
        while data := fh.read(piece):
            n += len(data)
    return n


async def aiohttp_ranged(url: str, size: int, out: memoryview, *, piece: int = 4 * MiB,
                         parallel: int = 8) -> int:
    """Ranged GETs of ``piece`` bytes, ``parallel`` at once, into a preallocated buffer."""
    sem = asyncio.Semaphore(parallel)
    connector = aiohttp.TCPConnector(limit=parallel)
    async with aiohttp.ClientSession(connector=connector, read_bufsize=1 << 20,
                                     auto_decompress=False) as session:
        async def one(start: int) -> None:
            stop = min(start + piece, size)
            async with sem, session.get(url, headers={"Range": f"bytes={start}-{stop - 1}"}
                                        ) as resp:
                resp.raise_for_status()
                pos = start
                async for data in resp.content.iter_any():
                    out[pos:pos + len(data)] = data
                    pos += len(data)
                if pos != stop:
                    raise RuntimeError(f"short range: {pos} of {stop}")

        await asyncio.gather(*(one(s) for s in range(0, size, piece)))
    return size


# -- local limits ------------------------------------------------------------------------
def page_cache_read(path: Path, out: memoryview, piece: int = 8 * MiB) -> int:
    """Read a (cached) local file into a preallocated buffer with ``readinto``."""
    n = 0
    with open(path, "rb", buffering=0) as fh:
        while n < len(out):
            got = fh.readinto(out[n:n + piece])
            if not got:
                break
            n += got
    return n


def iperf3_rate(seconds: int = 3) -> float | None:
    """One TCP stream over loopback with iperf3, in bytes/s; ``None`` without iperf3.

    ``seconds`` is whole (iperf3 reads ``-t 0.5`` as 0: run until stopped)."""
    seconds = max(1, int(seconds))
    if shutil.which("iperf3") is None:
        return None
    import json

    port = _free_port("127.0.0.1")
    server = subprocess.Popen(["iperf3", "-s", "-B", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # No probe connection: iperf3's server would count it as a failed test.
        for _ in range(50):
            out = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t",
                                  str(seconds), "-P", "1", "-J"], capture_output=True,
                                 text=True, timeout=seconds + 20)
            body: dict[str, Any] = json.loads(out.stdout or "{}")
            if "error" not in body and "end" in body:
                return float(body["end"]["sum_received"]["bits_per_second"]) / 8
            time.sleep(0.1)
        return None
    except (ValueError, KeyError, subprocess.TimeoutExpired):
        return None
    finally:
        server.kill()
        server.wait()


SENDER = """
import socket, sys
host, port, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
buf = bytes(1 << 20)
with socket.create_connection((host, port)) as s:
    left = total
    while left > 0:
        n = min(len(buf), left)
        s.sendall(memoryview(buf)[:n])
        left -= n
"""


def socket_pair_rate(total: int, out: memoryview) -> float:
    """One TCP stream over loopback between two Python processes (sendall → recv_into),
    in bytes/s."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        sender = subprocess.Popen([sys.executable, "-c", SENDER, "127.0.0.1", str(port),
                                   str(total)])
        try:
            conn, _ = listener.accept()
            with conn:
                got = 0
                start = time.perf_counter()
                while got < total:
                    n = conn.recv_into(out[got % len(out):], min(len(out) - got % len(out),
                                                                  total - got))
                    if not n:
                        break
                    got += n
                seconds = time.perf_counter() - start
        finally:
            sender.wait(30)
    return got / seconds
