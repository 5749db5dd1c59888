"""``stager job up``: a stager cluster for one Slurm job, on its nodes' local disks.

Run once per node inside the allocation (``srun --ntasks-per-node=1 stager job
up``), the way BeeOND starts BeeGFS per job.  The nodes meet through the job
directory, a directory on the shared file system (``$SLURM_SUBMIT_DIR/
.stager-job-ID`` unless ``--job-dir``/``STAGER_JOB_DIR``), mode 0700:

1. node 0 starts the metadata server on its address and writes ``meta.json``
   (with auth, the default, first ``admin.token`` and ``join.token``, 0600);
2. every node waits for ``meta.json`` and starts one data server on its
   node-local root, bound to and advertising its own address;
3. every node waits until the metadata server lists one healthy target per node;
4. with ``--stage-in SRC DST`` every node copies its share of ``SRC`` (file *i* of
   the sorted listing goes to node *i mod N*), so the copy runs from all nodes at
   once; node 0 then makes one resuming pass that only records the manifest;
5. with ``--attach SRC DST`` node 0 attaches ``DST`` to ``SRC`` (a cached view: the
   metadata server fetches each chunk on first read) and warms it;
6. node 0 writes ``cluster.json`` and ``env`` (``STAGER_META_URL``,
   ``STAGER_TOKEN_FILE``); every node returns once ``cluster.json`` exists, so the
   ``srun`` step ends when the cluster is ready and the data staged.

Any node that fails writes ``failed`` (the others stop waiting), stops what it
started and removes its root.  The job directory keeps ``failed`` and the
servers' logs under ``logs/``, also after ``job down`` on node 0 and the epilog
(which remove the rest: tokens, ``meta.json``), for the user to read.

Each node's root is its own: by default ``$TMPDIR/stager-job-ID.NODE``, so
neither two nodes sharing a ``/tmp`` nor two jobs on one node meet on one root.
``ROOT/.lock`` is held (``flock``) by ``job up`` and, inherited, by the servers
it starts, so a second ``job up`` on a root whose servers live is refused at
once; the lock dies with the last of them, so a killed cluster leaves none.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..client import AsyncClient
from ..client.warm import warm
from ..config import load_config
from ..errors import StagerError
from ..protocol.authmsg import MAX_TTL
from ..stage import StageOptions, stage
from .jobprocs import FAILED_FILE, LOGS_DIR, NodeRecord, record_path, spawn, stop_node
from .slurmenv import SlurmJob

POLL = 0.05
LOCK_FILE = ".lock"


class JobClusterError(RuntimeError):
    """The per-job cluster could not be brought up (the message says where it stopped)."""


@dataclass(frozen=True)
class JobOptions:
    root: Path                          # this node's local root (removed by job down)
    host: str                           # this node's address: bound and advertised
    run_dir: Path = Path("/tmp")        # where the node's record goes (the epilog looks)
    auth: bool = True                   # tokens in the job directory; False: --insecure
    meta_port: int = 0
    data_port: int = 0
    replicas: int = 1
    chunk_size: str | None = None
    cache_limit: str | None = None      # the metadata server's --cache-limit
    stage_in: tuple[tuple[str, str], ...] = ()
    attach: tuple[tuple[str, str], ...] = ()    # node 0: attached and warmed
    timeout: float = 120.0
    foreground: bool = False


class JobFiles:
    """The files of the job directory, where the nodes meet; ``step`` is the ``srun``
    step of this try (``SLURM_STEP_ID``), which tells a node's failure in it from one
    of an earlier try in the same job."""

    def __init__(self, job_dir: Path, step: str | None = None) -> None:
        self.dir = job_dir
        self.step = step
        self.meta = job_dir / "meta.json"
        self.admin_token = job_dir / "admin.token"
        self.join_token = job_dir / "join.token"
        self.cluster = job_dir / "cluster.json"
        self.env = job_dir / "env"
        self.failed = job_dir / FAILED_FILE
        self.staged = job_dir / "stage-in"
        self.logs = job_dir / LOGS_DIR

    def fail(self, node: str, why: object) -> None:
        """Add this node's line to ``failed``: every node of this try stops waiting.
        Every node's account is kept, in the order they failed: which one hit the cause
        and which were stopped because of it (a server killed under them) is a race,
        and neither line may hide the other.  An earlier try's file is replaced."""
        tag = f"step {self.step}: " if self.step is not None else ""
        line = f"{tag}node {node}: {why}\n".encode()
        try:      # a node may fail before node 0 made the directory: it waits for this
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            ours = self.failure() is not None
            fd = os.open(self.failed, os.O_WRONLY | os.O_CREAT
                         | (os.O_APPEND if ours else os.O_TRUNC), 0o600)
            try:
                os.write(fd, line)      # one write of one line: appends never interleave
            finally:
                os.close(fd)
        except OSError:
            pass

    def failure(self) -> str | None:
        """What a node of this try wrote to ``failed``, else None (also for the
        ``failed`` of an earlier try, until node 0 clears it)."""
        try:
            text = self.failed.read_text().strip()
        except OSError:
            return None
        if self.step is not None and text.startswith("step ") and \
                not text.startswith(f"step {self.step}: "):
            return None
        return text

    def clear_earlier_failure(self) -> None:
        """Node 0, starting: remove an earlier try's ``failed``; one of this try's (a
        node refused before node 0 got here) stays, so node 0 fails at once too."""
        why = self.failure()
        if why is None or self.step is None or not why.startswith(f"step {self.step}: "):
            self.failed.unlink(missing_ok=True)

    def another_failed(self) -> None:
        if (why := self.failure()) is not None:
            raise JobClusterError(f"another node failed: {why}")


def default_root(job: SlurmJob, env: Mapping[str, str] | None = None) -> Path:
    """``$TMPDIR/stager-job-ID.NODE`` (else under ``/tmp``): the job and the node in
    the name, since ``/tmp`` may be shared by nodes and is by a node's jobs."""
    env = os.environ if env is None else env
    return Path(env.get("TMPDIR") or "/tmp") / f"stager-job-{job.job_id}.{job.node}"


def hold_root(root: Path, job: SlurmJob) -> int:
    """Create ``root`` and lock ``root/.lock`` for this node's part of ``job``; returns
    the locked descriptor, which the servers inherit (see the module docstring).

    Raises :class:`JobClusterError` at once when a live ``job up`` or server holds it."""
    lock = root / LOCK_FILE
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise JobClusterError(f"cannot use {root} as this node's root: {exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _holder(fd)
        os.close(fd)
        raise JobClusterError(
            f"{root} is in use by live stager servers ({holder}; they hold {lock}): "
            "give each job and node a root of its own (the default, "
            "$TMPDIR/stager-job-ID.NODE, is)") from None
    text = f"job {job.job_id} node {job.node} pid {os.getpid()}\n".encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, text, 0)
    return fd


def _holder(fd: int, wait: float = 2.0) -> str:
    """Who holds the lock on ``fd``, as its holder wrote it: a holder that got the lock
    a moment ago may not have written its line yet, so a partial line is read again."""
    deadline = time.monotonic() + wait
    while True:
        text = os.pread(fd, 4096, 0).decode(errors="replace")
        if text.endswith("\n") or time.monotonic() >= deadline:
            return text.strip() or "unknown"
        time.sleep(0.02)


def _write_json(path: Path, body: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    tmp.replace(path)


def _wait_file(path: Path, files: JobFiles, deadline: float, what: str) -> dict[str, Any]:
    """The JSON in ``path`` once it appears; fails early when another node failed."""
    while time.monotonic() < deadline:
        files.another_failed()
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            time.sleep(POLL)
    raise JobClusterError(f"timed out waiting for {what} ({path})")


def _wait_ready(proc: Any, ready: Path, log: Path, deadline: float) -> str:
    """The URL a server wrote to its ready file once it listens."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise JobClusterError(f"server exited with {proc.returncode}; {log}: {tail}")
        try:
            return str(json.loads(ready.read_text())["url"])
        except (OSError, ValueError, KeyError):
            time.sleep(POLL)
    raise JobClusterError(f"server not ready in time; see {log}")


def _exposure(opts: JobOptions) -> list[str]:
    return ["--auth"] if opts.auth else ["--insecure"]


def _client(meta_url: str, token: str | None) -> AsyncClient:
    return AsyncClient(meta_url, config=load_config(), token=token)


class NodeUp:
    """One node's run of ``job up`` (see the module docstring for the steps)."""

    def __init__(self, job: SlurmJob, opts: JobOptions,
                 say: Callable[[str], None] = lambda line: None) -> None:
        self.job, self.opts, self.say = job, opts, say
        self.files = JobFiles(job.job_dir, job.step)
        self.record = NodeRecord(job.job_id, job.node, str(opts.root), str(job.job_dir),
                                 job.first)
        self.record_file = record_path(opts.run_dir, job.job_id, job.node)
        self.started = time.monotonic()
        self.deadline = self.started + opts.timeout
        self.token: str | None = None
        self.lock_fd = -1

    def run(self) -> dict[str, Any]:
        """Bring this node's part up; returns ``cluster.json``. On failure nothing of
        this node is left running and its root is gone; a root another live server
        holds is refused before anything there is touched."""
        try:
            self.lock_fd = hold_root(self.opts.root, self.job)
        except JobClusterError as exc:
            self.files.fail(self.job.node, exc)
            raise
        try:
            return self._run()
        except BaseException as exc:
            if not isinstance(exc, JobClusterError) or "another node failed" not in str(exc):
                self.files.fail(self.job.node, exc)
            stop_node(self.job.job_id, self.job.node, self.opts.run_dir, keep_job_dir=True,
                      grace=2.0)
            if self.job.first:      # job down (or the epilog) still removes the job dir
                self.record.pids = []
                self.record.save(self.record_file)
            raise

    def _run(self) -> dict[str, Any]:
        job, files = self.job, self.files
        self.opts.run_dir.mkdir(parents=True, exist_ok=True)
        self.record.save(self.record_file)
        if job.first:
            self._fresh_job_dir()
            meta_url = self._start_meta()
        else:
            meta_url = str(_wait_file(files.meta, files, self.deadline,
                                      "the metadata server")["url"])
        if self.opts.auth:
            self.token = files.admin_token.read_text().strip()
        data_url = self._start_data(meta_url)
        asyncio.run(self._wait_targets(meta_url))
        ready = time.monotonic() - self.started
        self.say(f"node {job.node}: data server {data_url} registered; "
                 f"{job.nnodes} node(s) ready in {ready:.2f}s")
        try:
            staged = asyncio.run(self._stage_in(meta_url)) if self.opts.stage_in else []
        except (StagerError, OSError) as exc:      # a source missing, refusing, cut off
            raise JobClusterError(f"stage-in failed: {exc}") from exc
        if not job.first:
            return _wait_file(files.cluster, files, self.deadline, "node 0's cluster.json")
        try:
            attached = asyncio.run(self._attach(meta_url)) if self.opts.attach else []
        except (StagerError, OSError) as exc:
            raise JobClusterError(f"attach failed: {exc}") from exc
        cluster = {"job_id": job.job_id, "meta": {"url": meta_url}, "nodes": list(job.nodes),
                   "auth": self.opts.auth, "ready_seconds": round(ready, 3),
                   "up_seconds": round(time.monotonic() - self.started, 3),
                   "stage_in": staged, "attach": attached}
        if self.opts.auth:
            cluster["token_file"] = str(files.admin_token)
            cluster["admin_token_file"] = str(files.admin_token)
        files.env.write_text(env_lines(cluster))
        _write_json(files.cluster, cluster)
        return cluster

    def _fresh_job_dir(self) -> None:
        files = self.files
        files.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        files.dir.chmod(0o700)
        if files.cluster.exists():
            raise JobClusterError(f"{files.cluster} exists: this job's cluster is up "
                                  "already (`stager job down` first)")
        for stale in (files.meta, files.admin_token, files.join_token):
            stale.unlink(missing_ok=True)
        files.clear_earlier_failure()

    def _spawn_server(self, role: str, argv: list[str]) -> str:
        root = self.opts.root / role
        root.mkdir(parents=True, exist_ok=True)
        ready = root / "server.json"
        ready.unlink(missing_ok=True)
        log = self.files.logs / f"{self.job.node}-{role}.log"
        proc = spawn([*argv, "--root", str(root), "--host", self.opts.host,
                      "--ready-file", str(ready)], log, self.job.job_id, self.job.node,
                     foreground=self.opts.foreground, hold=self.lock_fd)
        self.record.pids.append(proc.pid)
        self.record.save(self.record_file)
        return _wait_ready(proc, ready, log, self.deadline)

    def _start_meta(self) -> str:
        root, files = self.opts.root / "meta", self.files
        argv = ["meta", "--port", str(self.opts.meta_port), "--replicas",
                str(self.opts.replicas), *_exposure(self.opts)]
        if self.opts.chunk_size:
            argv += ["--chunk-size", self.opts.chunk_size]
        if self.opts.cache_limit:
            argv += ["--cache-limit", self.opts.cache_limit]
        if self.opts.auth:
            argv += ["--admin-token-file", str(root / "admin.token")]
        url = self._spawn_server("meta", argv)
        if self.opts.auth:
            admin = (root / "admin.token").read_text().strip()
            self._write_secret(files.admin_token, admin)
            join = asyncio.run(self._mint_join(url, admin))
            self._write_secret(files.join_token, join)
        _write_json(files.meta, {"url": url, "node": self.job.node})
        self.say(f"node {self.job.node}: metadata server {url}")
        return url

    @staticmethod
    def _write_secret(path: Path, text: str) -> None:
        path.unlink(missing_ok=True)
        path.touch(mode=0o600)
        path.write_text(text + "\n")

    @staticmethod
    async def _mint_join(url: str, admin: str) -> str:
        async with _client(url, admin) as client:
            made = await client.create_token(["join"], ["/"], MAX_TTL, "job data servers")
            return made.token

    def _start_data(self, meta_url: str) -> str:
        head = ["--token-file", str(self.files.join_token)] if self.opts.auth else []
        return self._spawn_server("data", [*head, "--meta", meta_url, "data", "--port",
                                           str(self.opts.data_port), "--node", self.job.node,
                                           *_exposure(self.opts)])

    async def _wait_targets(self, meta_url: str) -> None:
        """Until the metadata server lists a healthy target on every node of the job."""
        want = set(self.job.nodes)
        seen: set[str] = set()
        async with _client(meta_url, self.token) as client:
            while time.monotonic() < self.deadline:
                self.files.another_failed()
                try:
                    seen = {t.node for t in await client.targets() if t.up}
                except (StagerError, OSError):
                    seen = set()
                if want <= seen:
                    return
                await asyncio.sleep(POLL * 2)
        raise JobClusterError(f"targets of {sorted(want - seen)} not up in time")

    async def _stage_in(self, meta_url: str) -> list[dict[str, Any]]:
        """This node's share of every ``--stage-in``, then (node 0) the manifests."""
        job, files = self.job, self.files
        async with _client(meta_url, self.token) as client:
            for i, (src, dst) in enumerate(self.opts.stage_in):
                mine = await stage(client, src, dst, StageOptions(
                    share=(job.node_id, job.nnodes), manifest=False))
                _write_json(files.staged / f"{i}.{job.node_id}.json", mine.to_json())
                self.say(f"node {job.node}: {src} share {job.node_id}/{job.nnodes}: "
                         f"{mine.summary()}")
            shares = [[_wait_file(files.staged / f"{i}.{n}.json", files, self.deadline,
                                  f"node {n}'s stage-in") for n in range(job.nnodes)]
                      for i in range(len(self.opts.stage_in))]
            if not job.first:
                return []
            out = []
            for (src, dst), parts in zip(self.opts.stage_in, shares, strict=True):
                # Every file is in place: this pass skips them all and records the manifest.
                whole = await stage(client, src, dst)
                out.append({"source": src, "destination": dst, "files": whole.files,
                            "bytes": sum(p["bytes_copied"] for p in parts),
                            "seconds": max(p["seconds"] for p in parts),
                            "recopied": whole.copied})
            return out


    async def _attach(self, meta_url: str) -> list[dict[str, Any]]:
        """Node 0: attach each ``--attach`` and warm it (the metadata server fetches
        from the source; the bytes never pass through here)."""
        out = []
        async with _client(meta_url, self.token) as client:
            for src, dst in self.opts.attach:
                listed = (await client.attach(src, dst)).attachment
                warmed = await warm(client, dst) if listed.files else None
                fetched = warmed.bytes_fetched if warmed else 0
                self.say(f"node {self.job.node}: {src} attached at {dst}: {listed.files} "
                         f"files, {listed.bytes} bytes, {fetched} fetched")
                out.append({"source": src, "destination": dst, "files": listed.files,
                            "bytes": listed.bytes, "fetched": fetched})
        return out


def env_lines(cluster: dict[str, Any]) -> str:
    """``export`` lines for later steps: ``eval "$(stager job env)"``."""
    lines = [f"export STAGER_META_URL={shlex.quote(cluster['meta']['url'])}"]
    if cluster.get("token_file"):
        lines.append(f"export STAGER_TOKEN_FILE={shlex.quote(cluster['token_file'])}")
    return "\n".join(lines) + "\n"


def read_cluster(job_dir: Path) -> dict[str, Any]:
    path = JobFiles(job_dir).cluster
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        raise JobClusterError(f"no per-job cluster at {job_dir} (no cluster.json): "
                              "`stager job up` first") from None
