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
5. node 0 writes ``cluster.json`` and ``env`` (``STAGER_META_URL``,
   ``STAGER_TOKEN_FILE``); every node returns once ``cluster.json`` exists, so the
   ``srun`` step ends when the cluster is ready and the data staged.

Any node that fails writes ``failed`` (the others stop waiting), stops what it
started and removes its root; the job directory stays with the servers' logs
under ``logs/`` until ``job down`` on node 0 (or the epilog) removes it.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..client import AsyncClient
from ..config import load_config
from ..errors import StagerError
from ..protocol.authmsg import MAX_TTL
from ..stage import StageOptions, stage
from .jobprocs import NodeRecord, record_path, spawn, stop_node
from .slurmenv import SlurmJob

POLL = 0.05


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
    stage_in: tuple[tuple[str, str], ...] = ()
    timeout: float = 120.0
    foreground: bool = False


class JobFiles:
    """The files of the job directory, where the nodes meet."""

    def __init__(self, job_dir: Path) -> None:
        self.dir = job_dir
        self.meta = job_dir / "meta.json"
        self.admin_token = job_dir / "admin.token"
        self.join_token = job_dir / "join.token"
        self.cluster = job_dir / "cluster.json"
        self.env = job_dir / "env"
        self.failed = job_dir / "failed"
        self.staged = job_dir / "stage-in"
        self.logs = job_dir / "logs"


def _write_json(path: Path, body: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    tmp.replace(path)


def _wait_file(path: Path, files: JobFiles, deadline: float, what: str) -> dict[str, Any]:
    """The JSON in ``path`` once it appears; fails early when another node failed."""
    while time.monotonic() < deadline:
        if files.failed.exists():
            raise JobClusterError(f"another node failed: {files.failed.read_text().strip()}")
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
        self.files = JobFiles(job.job_dir)
        self.record = NodeRecord(job.job_id, job.node, str(opts.root), str(job.job_dir),
                                 job.first)
        self.record_file = record_path(opts.run_dir, job.job_id, job.node)
        self.started = time.monotonic()
        self.deadline = self.started + opts.timeout
        self.token: str | None = None

    def run(self) -> dict[str, Any]:
        """Bring this node's part up; returns ``cluster.json``. On failure nothing of
        this node is left running and its root is gone."""
        try:
            return self._run()
        except BaseException as exc:
            if not isinstance(exc, JobClusterError) or "another node failed" not in str(exc):
                try:
                    self.files.failed.write_text(f"node {self.job.node}: {exc}\n")
                except OSError:
                    pass
            stop_node(self.job.job_id, self.job.node, self.opts.run_dir, keep_job_dir=True,
                      grace=2.0)
            if self.job.first:      # job down (or the epilog) still removes the job dir
                self.record.pids = []
                self.record.save(self.record_file)
            raise

    def _run(self) -> dict[str, Any]:
        job, files = self.job, self.files
        self.opts.root.mkdir(mode=0o700, parents=True, exist_ok=True)
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
        staged = asyncio.run(self._stage_in(meta_url)) if self.opts.stage_in else []
        if not job.first:
            return _wait_file(files.cluster, files, self.deadline, "node 0's cluster.json")
        cluster = {"job_id": job.job_id, "meta": {"url": meta_url}, "nodes": list(job.nodes),
                   "auth": self.opts.auth, "ready_seconds": round(ready, 3),
                   "up_seconds": round(time.monotonic() - self.started, 3),
                   "stage_in": staged}
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
        for stale in (files.meta, files.failed, files.admin_token, files.join_token):
            stale.unlink(missing_ok=True)

    def _spawn_server(self, role: str, argv: list[str]) -> str:
        root = self.opts.root / role
        root.mkdir(parents=True, exist_ok=True)
        ready = root / "server.json"
        ready.unlink(missing_ok=True)
        log = self.files.logs / f"{self.job.node}-{role}.log"
        proc = spawn([*argv, "--root", str(root), "--host", self.opts.host,
                      "--ready-file", str(ready)], log, self.job.job_id, self.job.node,
                     foreground=self.opts.foreground)
        self.record.pids.append(proc.pid)
        self.record.save(self.record_file)
        return _wait_ready(proc, ready, log, self.deadline)

    def _start_meta(self) -> str:
        root, files = self.opts.root / "meta", self.files
        argv = ["meta", "--port", str(self.opts.meta_port), "--replicas",
                str(self.opts.replicas), *_exposure(self.opts)]
        if self.opts.chunk_size:
            argv += ["--chunk-size", self.opts.chunk_size]
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
                if self.files.failed.exists():
                    raise JobClusterError("another node failed: "
                                          + self.files.failed.read_text().strip())
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
