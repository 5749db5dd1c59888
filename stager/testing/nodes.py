"""A cluster of emulated nodes: one data server per network namespace, capped links.

:class:`NodeCluster` runs the metadata server in the root namespace and one
``stager data`` process inside each node's namespace, at the node's own address
(``ip netns exec NS python -m stager --meta URL data --host ADDR --port P …``).
Where namespaces cannot be made (not root, no iproute2) it says why and falls
back to ``mode="loopback"``: the same servers on 127.0.0.1, with no caps.

    with NodeCluster(tmp, nodes=4, rate_mbit=200) as cluster:
        client = AsyncClient(cluster.meta_url)
        ...
        cluster.set_rate(None)         # uncapped, e.g. while loading data

Every process it starts is killed and every namespace and link removed on
exit, on failure, on Ctrl-C and on SIGTERM (see :mod:`stager.testing.netns`).
The servers also die with the thread that started them (``PR_SET_PDEATHSIG``),
even on SIGKILL: start a cluster from a thread that outlives it (the main one).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .cluster import wait_for_targets
from .netns import NetnsFabric, netns_unavailable

log = logging.getLogger("stager.testing")
DATA_PORT = 7100
READY_TIMEOUT = 30.0
STOP_GRACE = 5.0    # seconds the servers get to exit on SIGTERM before SIGKILL
KILL_WAIT = 2.0     # seconds to reap them after SIGKILL; then the namespaces' teardown


def _die_with_parent() -> None:
    """A child gets SIGKILL if the process that started it dies, even by SIGKILL."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _signal_groups(procs: list[subprocess.Popen[bytes]],
                   sig: int) -> list[subprocess.Popen[bytes]]:
    """Send ``sig`` to the process group of each process still running (each was
    started in a session of its own), and return those."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
    return live


def _wait_all(procs: list[subprocess.Popen[bytes]],
              timeout: float) -> list[subprocess.Popen[bytes]]:
    """Wait up to ``timeout`` seconds in all for ``procs``; return those still running."""
    deadline = time.monotonic() + timeout
    left = []
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            left.append(p)
    return left


class NodeCluster:
    """A metadata server plus ``nodes`` data servers, each on its own emulated node.

    ``mode`` is ``"netns"``, ``"loopback"`` or ``"auto"`` (netns where possible).
    ``why_loopback`` says why an ``auto`` cluster fell back.  ``env`` adds
    ``STAGER_*`` settings for every server.
    """

    def __init__(self, root: str | os.PathLike[str], nodes: int, *,
                 rate_mbit: float | None = 200.0, mode: str = "auto",
                 env: Mapping[str, str] | None = None, meta_args: Sequence[str] = ()) -> None:
        if mode not in ("auto", "netns", "loopback"):
            raise ValueError(f"mode must be auto, netns or loopback, not {mode!r}")
        self.root = Path(root)
        self.n = nodes
        self.why_loopback = netns_unavailable() if mode != "loopback" else "asked for"
        if mode == "netns" and self.why_loopback:
            raise RuntimeError(f"netns mode unavailable: {self.why_loopback}")
        self.mode = "netns" if mode != "loopback" and not self.why_loopback else "loopback"
        if self.mode == "loopback" and mode == "auto":
            log.warning("network namespaces unavailable (%s): loopback-only, no caps",
                        self.why_loopback)
        self.fabric = NetnsFabric(nodes, rate_mbit=rate_mbit) if self.mode == "netns" else None
        self.env = {**os.environ, **(env or {})}
        self.meta_args = list(meta_args)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.meta_url = ""
        self.data_urls: list[str] = []

    # -- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> NodeCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        try:
            if self.fabric is not None:
                self.fabric.up()
            self._start_meta()
            starting = [self._spawn_data(i) for i in range(self.n)]
            deadline = time.monotonic() + READY_TIMEOUT
            self.data_urls = [self._wait_ready(p, ready, deadline) for p, ready in starting]
            wait_for_targets(self.meta_url, self.n, READY_TIMEOUT, exact=True)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every server, then remove the namespaces, in bounded time: SIGTERM
        each server's process group, SIGKILL what outlives :data:`STOP_GRACE`, and
        never wait on one for ever (the fabric's teardown kills whatever is left)."""
        procs, self.procs = self.procs, []
        try:
            live = _signal_groups(procs, signal.SIGTERM)
            live = _wait_all(live, STOP_GRACE)
            left = _wait_all(_signal_groups(live, signal.SIGKILL), KILL_WAIT)
            if left:
                log.warning("servers %s outlived SIGKILL by %.0f s",
                            [p.pid for p in left], KILL_WAIT)
        finally:
            if self.fabric is not None:
                self.fabric.down()

    # -- addresses -------------------------------------------------------------------
    @property
    def capped(self) -> bool:
        return self.fabric is not None and self.fabric.rate_mbit is not None

    @property
    def rate_mbit(self) -> float | None:
        return self.fabric.rate_mbit if self.fabric is not None else None

    def set_rate(self, rate_mbit: float | None) -> None:
        """Change the cap of every link (netns mode only; loopback is never capped)."""
        if self.fabric is not None:
            self.fabric.set_rate(rate_mbit)

    @property
    def host_address(self) -> str:
        """Where the root namespace (metadata server, client) is reachable from nodes."""
        return self.fabric.host_address if self.fabric is not None else "127.0.0.1"

    def address(self, i: int) -> str:
        """Node ``i``'s own address (127.0.0.1 in loopback mode)."""
        return self.fabric.nodes[i].address if self.fabric is not None else "127.0.0.1"

    # -- processes -------------------------------------------------------------------
    def popen_in(self, i: int, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside node ``i`` (in loopback mode, on this host); it is
        stopped with the cluster."""
        if self.fabric is not None:
            argv = self.fabric.netns_argv(i, argv)
        kwargs.setdefault("env", self.env)
        proc = subprocess.Popen(argv, preexec_fn=_die_with_parent, start_new_session=True,
                                **kwargs)
        self.procs.append(proc)
        return proc

    def _start_meta(self) -> None:
        root = self.root / "meta"
        root.mkdir(parents=True, exist_ok=True)
        ready = root / "server.json"
        ready.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "stager", "meta", "--root", str(root), "--host",
                self.host_address, "--port", "0", "--ready-file", str(ready),
                # addresses of namespaces this harness made, reachable from nowhere else
                "--insecure", *self.meta_args]
        with open(root / "server.log", "ab") as out:
            proc = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    preexec_fn=_die_with_parent, start_new_session=True)
        self.procs.append(proc)
        self.meta_url = self._wait_ready(proc, ready, time.monotonic() + READY_TIMEOUT)

    def _spawn_data(self, i: int) -> tuple[subprocess.Popen[bytes], Path]:
        root = self.root / f"data{i}"
        root.mkdir(parents=True, exist_ok=True)
        ready = root / "server.json"
        ready.unlink(missing_ok=True)
        port = DATA_PORT if self.fabric is not None else 0
        argv = [sys.executable, "-m", "stager", "--meta", self.meta_url, "data",
                "--root", str(root), "--host", self.address(i), "--port", str(port),
                "--node", f"node{i}", "--ready-file", str(ready), "--insecure"]
        with open(root / "server.log", "ab") as out:
            proc = self.popen_in(i, argv, stdout=out, stderr=subprocess.STDOUT)
        return proc, ready

    @staticmethod
    def _wait_ready(proc: subprocess.Popen[bytes], ready: Path, deadline: float) -> str:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                log_file = ready.parent / "server.log"
                tail = log_file.read_text()[-2000:] if log_file.exists() else ""
                raise RuntimeError(f"server exited with {proc.returncode}: {tail}")
            if ready.exists():
                try:
                    return str(json.loads(ready.read_text())["url"])
                except (ValueError, KeyError):
                    pass  # written atomically, but be safe against a partial read
            time.sleep(0.02)
        raise RuntimeError(f"server at {ready.parent} not ready in time")
