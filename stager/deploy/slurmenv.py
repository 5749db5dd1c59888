"""What a Slurm job step tells a process about itself, read from its environment.

``srun`` sets ``SLURM_JOB_ID``, ``SLURM_NODEID`` (this node's index in the
allocation), ``SLURM_JOB_NODELIST`` (``gpu[01-03,07],login1``) and
``SLURMD_NODENAME``, and ``SLURM_STEP_ID`` (the same on every node of one step);
``sbatch`` adds ``SLURM_SUBMIT_DIR``.  The node list is
expanded with ``scontrol show hostnames`` where that works and by
:func:`expand_hostlist` otherwise (a login node without a Slurm configuration,
the tests), which handles the same bracket syntax.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadRequest

_RANGE = re.compile(r"\[([^\]]*)\]")


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [part.strip() for part in out if part.strip()]


def _expand_range(body: str) -> list[str]:
    """``01-03,7`` → ``01 02 03 7``: a range keeps the width of its first bound."""
    values = []
    for piece in body.split(","):
        lo, sep, hi = piece.partition("-")
        if not sep:
            values.append(lo)
            continue
        if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
            raise BadRequest(f"bad host range [{body}]")
        values += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1)]
    return values


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list, expanded in order: ``n[0-2],gpu[07,09]`` →
    ``n0 n1 n2 gpu07 gpu09``; several brackets in one name multiply
    (``r[1-2]n[1-2]`` → ``r1n1 r1n2 r2n1 r2n2``)."""
    hosts: list[str] = []
    for name in _split_top(hostlist):
        names = [""]
        pos = 0
        for m in _RANGE.finditer(name):
            prefix = name[pos:m.start()]
            names = [n + prefix + v for n in names for v in _expand_range(m.group(1))]
            pos = m.end()
        hosts += [n + name[pos:] for n in names]
    return hosts


def hostnames(hostlist: str) -> list[str]:
    """``scontrol show hostnames HOSTLIST``, else :func:`expand_hostlist`."""
    if "[" in hostlist and shutil.which("scontrol"):
        try:
            out = subprocess.run(["scontrol", "show", "hostnames", hostlist],
                                 capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and out.stdout.split():
                return out.stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            pass
    return expand_hostlist(hostlist)


@dataclass(frozen=True)
class SlurmJob:
    """One node's view of its job: who it is, who the others are, where to write."""

    job_id: str
    node_id: int            # this node's index in the allocation; node 0 runs metadata
    nodes: tuple[str, ...]  # every node's name, in allocation order
    node: str               # this node's name
    job_dir: Path           # a directory every node sees (shared file system)
    step: str | None = None  # the srun step (SLURM_STEP_ID): one try of `job up`

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    @property
    def first(self) -> bool:
        return self.node_id == 0


def job_from_env(env: Mapping[str, str] | None = None, *, job_dir: str | None = None,
                 job_id: str | None = None) -> SlurmJob:
    """The job this process runs in, from Slurm's variables (see the module docstring);
    ``STAGER_JOB_DIR`` or ``job_dir`` overrides ``$SLURM_SUBMIT_DIR/.stager-job-ID``."""
    env = os.environ if env is None else env
    job_id = job_id or env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        raise BadRequest("not inside a Slurm job: SLURM_JOB_ID is not set (run under "
                         "`srun --ntasks-per-node=1 stager job up …`, or give --job-id)")
    listed = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    node = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    nodes = tuple(hostnames(listed)) if listed else (node,)
    raw_id = env.get("SLURM_NODEID")
    node_id = int(raw_id) if raw_id is not None else (nodes.index(node) if node in nodes else 0)
    if not 0 <= node_id < len(nodes):
        raise BadRequest(f"SLURM_NODEID={node_id} but the job has {len(nodes)} node(s)")
    where = job_dir or env.get("STAGER_JOB_DIR")
    if not where:
        where = str(Path(env.get("SLURM_SUBMIT_DIR") or os.getcwd()) / f".stager-job-{job_id}")
    return SlurmJob(job_id, node_id, nodes, node, Path(where), env.get("SLURM_STEP_ID"))


def node_address(node: str, given: str | None = None) -> str:
    """The address other nodes reach this one at: ``given``, else what ``node`` resolves
    to if that is not a loopback address, else this host's first global IPv4 address."""
    if given:
        return given
    try:
        for info in socket.getaddrinfo(node, None, socket.AF_INET, socket.SOCK_STREAM):
            if not ipaddress.ip_address(info[4][0]).is_loopback:
                return str(info[4][0])
    except OSError:
        pass
    for address in global_addresses():
        return address
    raise BadRequest(f"cannot tell this node's address ({node} resolves to no other "
                     "machine's reach): give --host ADDRESS")


def global_addresses() -> list[str]:
    """This host's global-scope IPv4 addresses, by ``ip -o -4 addr show scope global``."""
    if not shutil.which("ip"):
        return []
    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show", "scope", "global", "up"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = []
    for line in out.splitlines():
        words = line.split()
        if "inet" in words:
            found.append(words[words.index("inet") + 1].split("/")[0])
    return found
