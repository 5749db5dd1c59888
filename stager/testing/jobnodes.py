"""A Slurm job's nodes without Slurm: ``stager job up`` run as ``srun`` would run it.

:class:`EmulatedJob` gives each node its own network namespace and address
(:class:`~stager.testing.netns.NetnsFabric`; without root, every node on
127.0.0.1) and its own node-local root, sets the variables ``srun`` sets for a
one-task-per-node step (``SLURM_JOB_ID``, ``SLURM_NODEID``,
``SLURM_JOB_NODELIST``, ``SLURMD_NODENAME``, ``SLURM_SUBMIT_DIR``) and starts
one process per node inside that node's namespace::

    with EmulatedJob(tmp, nodes=3) as job:
        job.step(["job", "up", "--stage-in", str(src), "/ds"])   # every node, like srun
        cluster = job.cluster()            # cluster.json, written by node 0
        ...
        job.step(["job", "down"])
        assert job.leftovers() == ([], [])

The real-Slurm fixture runs the same commands through ``srun``; this one is
for machines (and tests) without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .netns import NetnsFabric, netns_unavailable

STEP_TIMEOUT = 180.0


class EmulatedJob:
    """``nodes`` emulated nodes of one job; ``mode`` is ``"netns"``, ``"loopback"`` or
    ``"auto"`` (namespaces where this machine allows them)."""

    def __init__(self, root: str | os.PathLike[str], nodes: int = 3, *, job_id: str = "42",
                 mode: str = "auto", rate_mbit: float | None = None) -> None:
        self.root = Path(root)
        self.n = nodes
        self.job_id = job_id
        why = netns_unavailable() if mode != "loopback" else "asked for"
        if mode == "netns" and why:
            raise RuntimeError(f"netns mode unavailable: {why}")
        self.mode = "netns" if mode != "loopback" and not why else "loopback"
        self.fabric = NetnsFabric(nodes, rate_mbit=rate_mbit) if self.mode == "netns" else None
        self.submit_dir = self.root / "submit"
        self.run_dir = self.root / "run"

    def __enter__(self) -> EmulatedJob:
        self.submit_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.fabric is not None:
            self.fabric.up()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for i in range(self.n):       # what a test left running: the epilog's work
                self.run(i, ["job", "down", "--quiet"], timeout=60)
        finally:
            if self.fabric is not None:
                self.fabric.down()

    # -- nodes ---------------------------------------------------------------------
    def node(self, i: int) -> str:
        return f"node{i}"

    def address(self, i: int) -> str:
        return self.fabric.nodes[i].address if self.fabric is not None else "127.0.0.1"

    def node_root(self, i: int) -> Path:
        """Node ``i``'s local disk (``--root`` of its ``job up``)."""
        return self.root / f"{self.node(i)}-local" / "stager"

    @property
    def job_dir(self) -> Path:
        return self.submit_dir / f".stager-job-{self.job_id}"

    def env(self, i: int) -> dict[str, str]:
        """What ``srun --ntasks-per-node=1`` gives the task on node ``i``."""
        return {**os.environ, "SLURM_JOB_ID": self.job_id, "SLURM_NODEID": str(i),
                "SLURM_JOB_NODELIST": f"node[0-{self.n - 1}]", "SLURM_JOB_NUM_NODES":
                str(self.n), "SLURMD_NODENAME": self.node(i),
                "SLURM_SUBMIT_DIR": str(self.submit_dir),
                "STAGER_JOB_RUN_DIR": str(self.run_dir)}

    def argv(self, i: int, args: list[str]) -> list[str]:
        """``python -m stager ARGS`` inside node ``i``; ``job up`` gets the node's root
        and address."""
        if args[:2] == ["job", "up"]:
            args = [*args, "--root", str(self.node_root(i)), "--host", self.address(i)]
        argv = [sys.executable, "-m", "stager", *args]
        return self.fabric.netns_argv(i, argv) if self.fabric is not None else argv

    def popen(self, i: int, args: list[str], **kwargs: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(i, args), env=self.env(i), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)

    def run(self, i: int, args: list[str], timeout: float = STEP_TIMEOUT
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(i, args), env=self.env(i), text=True,
                              capture_output=True, timeout=timeout)

    def step(self, args: list[str], timeout: float = STEP_TIMEOUT
             ) -> list[subprocess.CompletedProcess[str]]:
        """``args`` on every node at once, like an ``srun`` step; raises with every
        node's output if one fails."""
        procs = [self.popen(i, args) for i in range(self.n)]
        done = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
        if any(d.returncode for d in done):
            report = "\n".join(f"-- node{i} rc={d.returncode}\n{d.stdout}{d.stderr}"
                               for i, d in enumerate(done))
            raise RuntimeError(f"`stager {' '.join(args)}` failed:\n{report}")
        return done

    def epilog(self, i: int, script: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
        """The Slurm epilog ``script`` on node ``i``, with the variables slurmd gives it."""
        env = {**self.env(i), "SLURM_JOB_UID": str(os.getuid()),
               "STAGER": f"{sys.executable} -m stager"}
        argv = ["sh", str(script)]
        if self.fabric is not None:
            argv = self.fabric.netns_argv(i, argv)
        return subprocess.run(argv, env=env, text=True, capture_output=True, timeout=120)

    # -- what is there -------------------------------------------------------------
    def cluster(self) -> dict[str, Any]:
        body: dict[str, Any] = json.loads((self.job_dir / "cluster.json").read_text())
        return body

    def processes(self) -> list[int]:
        """Pids of every live process carrying this job's id (by its environment)."""
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                raw = Path(f"/proc/{entry.name}/environ").read_bytes()
                state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if f"STAGER_JOB_ID={self.job_id}".encode() in raw.split(b"\0") and state != "Z":
                found.append(int(entry.name))
        return found

    def leftovers(self) -> tuple[list[int], list[str]]:
        """(live job processes, files left on the nodes' roots, job dir and run dir)."""
        files = [str(p) for i in range(self.n) if self.node_root(i).exists()
                 for p in [self.node_root(i), *self.node_root(i).rglob("*")]]
        files += [str(p) for p in [self.job_dir] if p.exists()]
        files += [str(p) for p in self.run_dir.glob(f"stager-job-{self.job_id}.*")]
        return self.processes(), files
