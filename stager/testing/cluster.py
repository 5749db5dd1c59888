"""Real clusters for tests and benchmarks: in-process (threads) or as processes.

:class:`ThreadCluster` runs a metadata server and N data servers on one event
loop in a background thread, on ``127.0.0.1:0``: quick to start, and a data
server can be stopped and started again on the same root.
:class:`ProcessCluster` runs ``stager up`` as a subprocess, for tests that
kill servers with SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..auth.tls import client_context, ensure_cluster_tls
from ..config import Config, load_config
from ..protocol.authmsg import TokenRequest
from ..protocol.routes import route

FAST = {"heartbeat_interval": 0.2, "target_timeout": 3.0, "gc_interval": 0.2,
        "connect_timeout": 2.0, "request_timeout": 10.0}


@dataclass
class _Server:
    stop: asyncio.Event
    done: Future[None]
    url: str = ""
    root: Path = field(default_factory=Path)
    node: str = ""
    app: Any = None          # the running aiohttp application (its state, for tests)


class ThreadCluster:
    """A metadata server and ``data_servers`` data servers in one background thread;
    with ``tls=True`` every server speaks HTTPS with a certificate of a private CA
    made under ``ROOT/tls/`` (``config.ca_file``, which the servers trust too)."""

    def __init__(self, root: str | os.PathLike[str], data_servers: int = 3,
                 tls: bool = False, **overrides: Any) -> None:
        self.root = Path(root)
        self.n = data_servers
        if tls:
            files = ensure_cluster_tls(self.root / "tls")
            overrides = {"tls_cert": str(files.cert), "tls_key": str(files.key),
                         "ca_file": str(files.ca_cert), **overrides}
        self.config = load_config({**FAST, **overrides}, env={})
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="stager-cluster",
                                       daemon=True)
        self.meta: _Server | None = None
        self.data: list[_Server | None] = [None] * data_servers
        self.admin_token = ""       # with auth=True: ROOT/meta/admin.token
        self.join_token = ""        # ... and a join token minted for the data servers

    # -- lifecycle ---------------------------------------------------------------
    def __enter__(self) -> ThreadCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 30) -> Any:
        """Run ``coro`` on the servers' loop (e.g. a method of a server's own object
        that a test drives directly) and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> None:
        self.thread.start()
        self.start_meta()
        for i in range(self.n):
            self.start_data(i)
        self.wait_targets(self.n)

    def stop(self) -> None:
        for i in range(self.n):
            self.stop_data(i)
        if self.meta is not None:
            self._stop_server(self.meta)
            self.meta = None
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    @property
    def meta_url(self) -> str:
        assert self.meta is not None
        return self.meta.url

    def data_config(self, i: int) -> Config:
        return self.config.replace(root=str(self.root / f"data{i}"), port=0, node=f"node{i}",
                                   meta_url=self.meta_url, token=self.join_token)

    # -- servers -------------------------------------------------------------------
    def _serve(self, make_app: Any, config: Config, after_bind: Any = None) -> _Server:
        from ..web.server import serve

        ready = Path(config.root) / "server.json"
        ready.unlink(missing_ok=True)

        async def begin() -> _Server:
            stop = asyncio.Event()
            app = make_app(config)
            task = asyncio.ensure_future(serve(app, config, stop=stop, ready_file=ready,
                                               after_bind=after_bind(app) if after_bind
                                               else None))
            done: Future[None] = Future()
            task.add_done_callback(lambda t: _settle(t, done))
            return _Server(stop=stop, done=done, root=Path(config.root), node=config.node,
                           app=app)

        server: _Server = self.call(begin())
        deadline = time.monotonic() + 10
        while not ready.exists():
            if server.done.done():
                server.done.result()
            if time.monotonic() > deadline:
                raise RuntimeError(f"server at {config.root} did not start")
            time.sleep(0.01)
        server.url = json.loads(ready.read_text())["url"]
        return server

    def start_meta(self, port: int = 0) -> None:
        from ..meta.http.app import make_meta_app
        from ..meta.presence import announcer

        self.meta = self._serve(make_meta_app, self.config.replace(
            root=str(self.root / "meta"), port=port), after_bind=announcer)
        if self.config.auth and not self.join_token:
            self.admin_token = (self.root / "meta" / "admin.token").read_text().strip()
            self.join_token = mint_token(self.meta_url, self.admin_token, ["join"],
                                         name="data servers", ca_file=self.config.ca_file)

    def mint(self, scopes: list[str], prefixes: tuple[str, ...] = ("/",), ttl: int = 3600,
             name: str = "test") -> str:
        """A token from this cluster's metadata server (auth on)."""
        return mint_token(self.meta_url, self.admin_token, scopes, prefixes, ttl, name,
                          ca_file=self.config.ca_file)

    def stop_meta(self) -> None:
        if self.meta is not None:
            self._stop_server(self.meta)
            self.meta = None

    def start_data(self, i: int) -> None:
        from ..data.app import SERVICE, make_data_app
        from ..data.registration import register_and_heartbeat
        from ..web.authmw import GATE

        config = self.data_config(i)

        def announce(app: Any) -> Any:
            return lambda url: register_and_heartbeat(app[SERVICE], config, url,
                                                      app.get(GATE))

        self.data[i] = self._serve(make_data_app, config, after_bind=announce)

    def stop_data(self, i: int) -> None:
        server = self.data[i]
        if server is not None:
            self._stop_server(server)
            self.data[i] = None

    def _stop_server(self, server: _Server) -> None:
        self.loop.call_soon_threadsafe(server.stop.set)
        server.done.result(30)

    def target_id(self, i: int) -> str:
        return str(json.loads((self.root / f"data{i}" / "target.json").read_text())["target_id"])

    def wait_targets(self, up: int, timeout: float = 15) -> None:
        wait_for_targets(self.meta_url, up, timeout, token=self.admin_token,
                         ca_file=self.config.ca_file)


def _settle(task: asyncio.Task[None], done: Future[None]) -> None:
    exc = None if task.cancelled() else task.exception()
    if exc is not None:
        done.set_exception(exc)
    else:
        done.set_result(None)


def mint_token(meta_url: str, admin_token: str, scopes: list[str],
               prefixes: tuple[str, ...] = ("/",), ttl: int = 3600, name: str = "test",
               *, ca_file: str = "") -> str:
    """A new token from the metadata server at ``meta_url``, asked with ``admin_token``
    (an https server checked against ``ca_file``)."""
    body = json.dumps(TokenRequest(tuple(scopes), prefixes, ttl, name).to_json()).encode()
    req = urllib.request.Request(route("create_token").url(meta_url), data=body, headers={
        "Authorization": f"Bearer {admin_token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10, context=_tls(ca_file)) as resp:
        return str(json.load(resp)["token"])


def _tls(ca_file: str) -> ssl.SSLContext | None:
    """urllib's context for ``ca_file`` (``None``: its default, the system's store)."""
    return client_context(ca_file) if ca_file else None


def wait_for_targets(meta_url: str, up: int, timeout: float = 15, *, exact: bool = False,
                     token: str = "", ca_file: str = "") -> None:
    """Wait until the metadata server lists ``up`` healthy targets."""
    deadline = time.monotonic() + timeout
    context = _tls(ca_file)
    seen = -1
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(route("list_targets").url(meta_url), headers=headers)
            with urllib.request.urlopen(req, timeout=2, context=context) as resp:
                seen = sum(t["state"] == "up" for t in json.load(resp)["targets"])
            if seen == up or (seen >= up and not exact):
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{seen} targets up, wanted {up}")


class ProcessCluster:
    """``stager up`` in a subprocess; servers can be killed with SIGKILL."""

    def __init__(self, root: str | os.PathLike[str], data_servers: int = 3,
                 replicas: int = 1, env: dict[str, str] | None = None,
                 fast: bool = True, restart: bool = False, auth: bool = False,
                 tls: bool = False, meta_store: str = "", meta_servers: int = 1,
                 up_args: Sequence[str] = ()) -> None:
        """``fast`` shortens heartbeats and timeouts, for tests; ``restart`` runs
        ``stager up --restart``, which starts a killed server again; ``auth`` runs
        ``stager up --auth`` (its admin token: :attr:`admin_token`); ``tls``:
        ``stager up --tls`` (HTTPS, its CA in :attr:`ca_file`); ``meta_store`` and
        ``meta_servers``: ``--meta-store URL --meta-servers N`` (:attr:`meta_urls`);
        ``up_args``: more flags of ``stager up`` (``["--cache-limit", "2MiB"]``)."""
        self.root = Path(root)
        self.auth = auth
        self.n = data_servers
        self.replicas = replicas
        self.restart = restart
        self.tls = tls
        self.meta_args = ([f"--meta-store={meta_store}"] if meta_store else []) + \
            (["--meta-servers", str(meta_servers)] if meta_servers != 1 else []) + \
            list(up_args)
        tuned = {f"STAGER_{k.upper()}": str(v) for k, v in FAST.items()} if fast else {}
        self.env = {**os.environ, **tuned, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}

    def __enter__(self) -> ProcessCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 60) -> None:
        (self.root / "cluster.json").unlink(missing_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "up.log", "ab") as log:   # the child keeps its own copy
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "stager", "up", "--root", str(self.root), "--port", "0",
                 "--data-servers", str(self.n), "--replicas", str(self.replicas),
                 *(["--restart"] if self.restart else []), *(["--auth"] if self.auth else []),
                 *(["--tls"] if self.tls else []), *self.meta_args],
                env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not (self.root / "cluster.json").exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"stager up exited: {(self.root / 'up.log').read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError("stager up did not start in time")
            time.sleep(0.01)        # a stat a poll: cheap, and a cluster is up in ~0.7 s
        self.info = json.loads((self.root / "cluster.json").read_text())

    def stop(self, timeout: float = 20) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code

    @property
    def meta_url(self) -> str:
        return str(self.info["meta"]["url"])

    @property
    def meta_urls(self) -> list[str]:
        """Every metadata server's URL, the first first (``"metas"`` in cluster.json)."""
        return [str(m["url"]) for m in self.info.get("metas", [self.info["meta"]])]

    def meta_pid(self, i: int = 0) -> int:
        return int(self.info.get("metas", [self.info["meta"]])[i]["pid"])

    @property
    def admin_token(self) -> str:
        """The admin token ``stager up --auth`` wrote (auth on)."""
        return Path(self.info["admin_token_file"]).read_text().strip()

    def mint(self, scopes: list[str], prefixes: tuple[str, ...] = ("/",), ttl: int = 3600,
             name: str = "test") -> str:
        """A token from this cluster's metadata server (auth on)."""
        return mint_token(self.meta_url, self.admin_token, scopes, prefixes, ttl, name,
                          ca_file=self.ca_file)

    @property
    def ca_file(self) -> str:
        """The CA the cluster's certificates chain to (``stager up --tls``), else ``""``."""
        return str(self.info.get("ca_file", ""))

    def data_pid(self, i: int) -> int:
        return int(self.info["data"][i]["pid"])

    def kill_data(self, i: int) -> None:
        os.kill(self.data_pid(i), signal.SIGKILL)

    def kill_meta(self, i: int = 0) -> None:
        os.kill(self.meta_pid(i), signal.SIGKILL)

    def reload(self) -> dict[str, Any]:
        """Re-read ``cluster.json`` (``--restart`` rewrites it with new pids)."""
        self.info = json.loads((self.root / "cluster.json").read_text())
        return self.info

    def wait_restarted(self, role: str, i: int, old_pid: int, timeout: float = 30) -> float:
        """Wait until ``--restart`` brought server ``i`` of ``role`` ("meta" or "data")
        back with a new pid; returns the seconds waited."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            try:
                info = self.reload()
                metas = info.get("metas", [info["meta"]])
                entry = metas[i] if role == "meta" else info["data"][i]
                if int(entry["pid"]) != old_pid:
                    return time.monotonic() - start
            except (OSError, ValueError, KeyError):
                pass            # being rewritten
            time.sleep(0.01)
        raise TimeoutError(f"{role} server {i} was not restarted within {timeout}s")

    def data_root(self, i: int) -> Path:
        return self.root / f"data{i}"

    def target_id(self, i: int) -> str:
        return str(json.loads((self.data_root(i) / "target.json").read_text())["target_id"])
