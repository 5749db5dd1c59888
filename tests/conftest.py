"""Fixtures: real clusters on 127.0.0.1:0, clients bound to them, a guard on the loop."""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import re
import ssl
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from email.message import Message
from http.client import HTTPConnection, HTTPSConnection
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from stager import AsyncClient, Client
from stager.config import load_config
from stager.testing import ThreadCluster
from stager.testing.locks import NODES_LOCK, exclusive
from stager.testing.mount import Mounted
from stager.testing.postgres import PostgresServer, PostgresUnavailable, start_postgres

MiB = 1 << 20
SLOW_CALLBACK = 0.5  # seconds a server callback may hold the loop before a test fails


class _Steal:
    """CPU time the hypervisor took from this machine (``steal`` in /proc/stat), in
    seconds per CPU, sampled every 20 ms: on a shared virtual machine a callback's
    wall time includes stretches when no vCPU of ours ran at all."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, float]] = deque(maxlen=3000)     # a minute
        self.samples.append((time.monotonic(), self.now()))
        threading.Thread(target=self._sample, name="steal-sampler", daemon=True).start()

    @staticmethod
    def now() -> float:
        try:
            with open("/proc/stat") as f:
                steal = int(f.readline().split()[8])
        except (OSError, IndexError, ValueError):
            return 0.0
        return steal / os.sysconf("SC_CLK_TCK") / (os.cpu_count() or 1)

    def _sample(self) -> None:
        while True:
            time.sleep(0.02)
            self.samples.append((time.monotonic(), self.now()))

    def since(self, start: float) -> float:
        """Seconds stolen (per CPU) from ``start`` (monotonic) until now."""
        before = self.samples[0][1]
        for t, value in list(self.samples):
            if t > start:
                break
            before = value
        return max(0.0, self.now() - before)


class _SlowCallbacks(logging.Handler):
    """Collects asyncio's debug-mode reports of callbacks that blocked the loop.
    Kept apart (``excused``), not counted: a report whose callback would have
    been quick but for time the hypervisor stole from the machine meanwhile,
    and the callback by which a test hands the cluster's loop a coroutine
    (``run_coroutine_threadsafe``): it only creates the task, which runs in
    callbacks of its own, so no server code runs in it and its time can only
    be the machine's; and the harness's step that builds a server (its SQLite
    database, its directories), which ``stager meta``/``stager data`` take on
    their own loop before serving anything."""

    HAND_OVER = "Handle run_coroutine_threadsafe.<locals>.callback()"
    BUILD = "coro=<ThreadCluster._serve.<locals>.begin()"

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []
        self.excused: list[str] = []
        self.steal = _Steal()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "took" not in message or "Executing" not in message:
            return
        took = re.search(r"took ([0-9.]+) seconds", message)
        seconds = float(took.group(1)) if took else float("inf")
        if self.HAND_OVER in message:
            self.excused.append(f"{message} (a hand-over: no server code runs in it)")
            return
        if self.BUILD in message:
            self.excused.append(f"{message} (the harness building a server, its database "
                                "and directories: a real server does that on its own loop "
                                "before it serves)")
            return
        stolen = self.steal.since(time.monotonic() - seconds)
        if seconds - stolen < SLOW_CALLBACK:
            self.excused.append(f"{message} ({stolen:.3f} s of it stolen by the hypervisor)")
        else:
            self.records.append(message)


@pytest.fixture(scope="session")
def slow_callbacks() -> Iterator[_SlowCallbacks]:
    handler = _SlowCallbacks()
    logging.getLogger("asyncio").addHandler(handler)
    yield handler
    logging.getLogger("asyncio").removeHandler(handler)


def numbered_files_loader(meta_url: str, token: str, ns: str, files: int, batch_size: int
                          ) -> Any:
    """``files`` files under ``ns/d``, each holding its number (2 bytes), and a Loader
    of them (format files, one epoch, no telemetry): the auth look-ahead tests' data."""
    from stager import Client
    from stager.config import load_config
    from stager.loader import Loader
    with Client(meta_url, config=load_config(env={}), token=token) as c:
        c.write_many([(f"{ns}/d/{i:05d}", i.to_bytes(2, "big")) for i in range(files)])
    return Loader(f"{ns}/d", batch_size=batch_size, meta_url=meta_url, token=token,
                  format="files", config=load_config(env={}), report=False,
                  prefetch_next_epoch=False)


def md5(data: bytes) -> str:
    """The hex MD5 of ``data``: an S3 part's or single-part object's ETag."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def start_cluster(root: Path, data_servers: int = 3, **overrides: object) -> ThreadCluster:
    cluster = ThreadCluster(root, data_servers, **overrides)
    cluster.loop.set_debug(True)
    cluster.loop.slow_callback_duration = SLOW_CALLBACK
    cluster.start()
    return cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            slow_callbacks: _SlowCallbacks) -> Iterator[ThreadCluster]:
    """Three data servers (nodes node0..node2) and a metadata server, shared by a module."""
    c = start_cluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()


@pytest.fixture(scope="module", autouse=True)
def _frozen_heap() -> None:
    """Put what earlier modules left out of the garbage collector's reach.  Late
    in the suite pytest's heap is millions of objects, and a full collection
    walks them all holding the GIL (0.6 s for 1.5 million on this machine): the
    in-process servers' loops stood still for it, and the guard below failed a
    test whose own callbacks were quick."""
    gc.freeze()


@pytest.fixture(autouse=True)
def _no_blocked_loop(slow_callbacks: _SlowCallbacks) -> Iterator[None]:
    """Fail any test during which a server callback blocked its event loop."""
    before = len(slow_callbacks.records)
    yield
    blocked = slow_callbacks.records[before:]
    assert not blocked, f"the event loop was blocked: {blocked}"


@pytest.fixture
def ns() -> str:
    """A fresh directory name in the namespace, so tests sharing a cluster never collide."""
    return f"/t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def client(cluster: ThreadCluster) -> Iterator[Client]:
    c = Client(cluster.meta_url, config=load_config(env={}))
    yield c
    c.close()


@pytest.fixture
async def aclient(cluster: ThreadCluster) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
        yield c


@pytest.fixture
def payload() -> callable:  # type: ignore[valid-type]
    """Random bytes of a given size (deterministic per size).  Made a MiB per call:
    one ``randbytes`` call holds the GIL throughout (0.62 s for 96 MiB), and an
    in-process server's callback waiting for it failed the blocked-loop guard."""
    def make(size: int) -> bytes:
        import random

        rng = random.Random(size)
        return b"".join(rng.randbytes(min(MiB, size - at)) for at in range(0, size, MiB))
    return make


@dataclass
class Reply:
    """One raw HTTP exchange's answer (see the ``http`` fixture)."""

    status: int
    headers: Message
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def raw_http(base_url: str, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None, timeout: float = 30,
             context: ssl.SSLContext | None = None) -> Reply:
    """Send ``path`` exactly as written (no URL normalisation), read the whole answer
    (from an ``https://`` server checked with ``context``)."""
    url = urlsplit(base_url)
    conn = HTTPSConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout,
                           context=context) if url.scheme == "https" else \
        HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return Reply(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


def meta_requests(http, cluster: ThreadCluster) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Requests the metadata server answered, by operation (its /metrics)."""
    text = http(cluster.meta_url, "GET", "/metrics").body.decode()
    out: dict[str, float] = {}
    for op, value in re.findall(r'^stager_requests_total\{op="(\w+)",status="2\d\d"\} (\S+)$',
                                text, re.M):
        out[op] = out.get(op, 0.0) + float(value)
    return out


def raw_to_meta(c: AsyncClient, meta_url: str) -> int:
    """Open connections of ``c``'s raw HTTP client to the metadata server at ``meta_url``
    (the requests that skip aiohttp: stager/client/metaconn.py)."""
    port = urlsplit(meta_url).port
    return sum(1 for conn in c.plane.session.connector.raw._all   # type: ignore[attr-defined]
               if conn.transport is not None and not conn.closed
               and conn.transport.get_extra_info("peername")[1] == port)


@pytest.fixture
def http() -> Callable[..., Reply]:
    """``http(base_url, method, raw_path, body=None, headers=None)`` → :class:`Reply`."""
    return raw_http


@pytest.fixture(scope="module")
def mnt(cluster: ThreadCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mounted]:
    """The cluster's whole namespace mounted read-write (``stager mount``) for a module;
    always unmounted, whatever happened."""
    with Mounted(cluster.meta_url, tmp_path_factory.mktemp("fuse") / "mnt") as m:
        yield m


@pytest.fixture
def here(mnt: Mounted, client: Client, ns: str) -> Path:
    """This test's own directory ``ns``, seen through the mount."""
    client.mkdir(ns)
    return mnt.mountpoint / ns.lstrip("/")


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL for the whole session (initdb, pg_ctl, a free port);
    the tests that need it skip, saying why, where it cannot start."""
    try:
        server = start_postgres()
    except PostgresUnavailable as exc:
        pytest.skip(f"no PostgreSQL here: {exc}")
    yield server
    server.destroy()


@pytest.fixture
def pg_url(postgres: PostgresServer) -> str:
    """A fresh, empty database of the session's PostgreSQL: its URL."""
    return postgres.create_database()


# The metadata stores the core, fsspec and Loader modules run against: their
# module-scoped cluster fixtures take these as params (``meta_store_of``).
STORES = ["sqlite", "postgresql"]


def meta_store_of(request: pytest.FixtureRequest) -> str:
    """The ``meta_store`` setting for the store ``request.param`` names: "" (SQLite under
    the server's ROOT), or a fresh database of the session's PostgreSQL (skipping, with
    the ``postgres`` fixture's reason, where PostgreSQL cannot start)."""
    if request.param == "sqlite":
        return ""
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.create_database()


def assert_store(root: Path, meta_store: str) -> None:
    """The metadata server under ``root`` uses the store it was given: a SQLite file
    under ``ROOT/meta`` only without ``meta_store``."""
    assert (root / "meta" / "meta.sqlite3").exists() == (not meta_store), meta_store


def cluster_on_each_store(request: pytest.FixtureRequest,
                          tmp_path_factory: pytest.TempPathFactory,
                          slow_callbacks: _SlowCallbacks) -> Iterator[ThreadCluster]:
    """The ``cluster`` fixture, once with each metadata store: a module makes it its
    own with ``pytest.fixture(scope="module", params=STORES, name="cluster")(...)``."""
    store = meta_store_of(request)
    c = start_cluster(tmp_path_factory.mktemp("cluster"), meta_store=store)
    assert_store(c.root, store)
    yield c
    c.stop()


def pytest_configure(config: pytest.Config) -> None:
    os.environ.pop("STAGER_META_URL", None)
    if config.getoption("--strict-skips") and not hasattr(config, "workerinput"):
        from skip_budget import SkipBudget

        config.pluginmanager.register(SkipBudget(), "skip-budget")


NODE_GROUP = "slurm"     # the xdist group of the modules that start nodes or a Slurm


@pytest.fixture(scope="module", autouse=True)
def _nodes_in_turn(request: pytest.FixtureRequest) -> Iterator[None]:
    """A module of the ``slurm`` group (emulated nodes, network namespaces, per-job
    clusters, a test Slurm) holds the machine's nodes lock while it runs: the group
    keeps such modules apart under xdist, and the lock keeps them apart from the
    benchmarks that start nodes, which the quick run of every benchmark runs in their
    turn.  That run (tests/test_bench_quick.py) is in the group too, so that under
    xdist it never waits on one worker, idle, for a module of the group on the other
    (CI saw it wait 100 s so); it does not hold the lock itself (``NODES_IN_TURN =
    False``): bench/runner.py takes it around each benchmark that starts nodes, and
    would wait for the module that runs it."""
    group = request.node.get_closest_marker("xdist_group")
    if group is None or group.args[:1] != (NODE_GROUP,) or \
            not getattr(request.module, "NODES_IN_TURN", True):
        yield
        return
    with exclusive(NODES_LOCK):
        yield


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``-n N --dist loadgroup`` (``make test``) a module goes to one worker whole,
    so its module-scoped cluster starts once: a test without an ``xdist_group`` of its
    own is in its module's group.  Modules sharing something that cannot run twice at
    once (one Slurm at a time) name a common group.

    The modules marked ``slow`` or ``faults`` (minutes, some of them) come first, the
    rest in their order: workers take modules in this order (``--no-loadscope-reorder``),
    so no long module starts last and runs alone while the other workers idle.  First
    of all the ``slurm`` group, by far the longest unit (its modules and the quick run
    of every benchmark, one after another: about 6 minutes on CI's 2 cores): started
    first, it ends long before the others' share of the rest."""
    heavy, nodes = set(), set()
    for item in items:
        group = item.get_closest_marker("xdist_group")
        if group is None:
            module = item.nodeid.split("::")[0].removeprefix("tests/").removesuffix(".py")
            item.add_marker(pytest.mark.xdist_group(module))
        elif group.args[:1] == (NODE_GROUP,):
            nodes.add(item.path)
        if item.get_closest_marker("slow") or item.get_closest_marker("faults"):
            heavy.add(item.path)
    items.sort(key=lambda item: (item.path not in nodes, item.path not in heavy))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fault scenarios' figures (the ``figures`` fixture of tests/faults/conftest.py),
    read from the reports: here, because pytest-xdist's controller, which prints the
    summary, loads this conftest but not those below it."""
    shown = [(report.nodeid.split("::")[-1], value)
             for reports in terminalreporter.stats.values() for report in reports
             if getattr(report, "when", "") == "teardown"
             for key, value in getattr(report, "user_properties", ()) if key == "figures"
             if value]
    if not shown:
        return
    terminalreporter.section("fault-injection figures")
    for name, measured in shown:
        terminalreporter.write_line(name)
        for key, value in measured.items():
            terminalreporter.write_line(f"    {key}: {value}")


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here, not in tests/faults/conftest.py: pytest only asks the conftests it loads
    # first (this one, whatever the arguments) for options.
    parser.addoption("--long", action="store_true", default=False,
                     help="long soaks instead of CI-sized runs (tests/faults/test_history.py, "
                          "tests/faults/test_soak.py)")
    parser.addoption("--strict-skips", action="store_true", default=False,
                     help="fail the run on any skip outside tests/skip_budget.py's list")
