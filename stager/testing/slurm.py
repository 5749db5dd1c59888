"""A real Slurm on this one machine: munged, slurmctld, and one slurmd per emulated node.

``slurmctld`` runs in the root namespace on the bridge address of a
:class:`~stager.testing.netns.NetnsFabric`; node ``n<i>`` is a ``slurmd -N n<i>``
started with ``nsenter --net`` inside namespace *i*, so each node has its own
address (``ip netns exec`` would mount a ``/sys`` without cgroups, which slurmd
refuses).  No cgroups are needed: ``proctrack/pgid``, ``task/none``.  Burst
buffers go through ``burst_buffer/lua`` with the script and ``burst_buffer.conf``
given to the cluster.

Everything lives under one directory made for the cluster (world-readable, so
the unprivileged user that submits jobs -- root may not allocate burst buffers --
can read the job scripts and write their output).  The cluster name and ports
are unique to it, and ``munged`` runs on a key and socket of its own, so it
never meets another Slurm.  :meth:`SlurmCluster.down` kills every daemon it
started with all their descendants (hook scripts, ``slurmstepd``, job
processes) and removes the namespaces; it is bounded in time.

Needs root, the Debian packages ``slurmctld slurmd slurm-client munge
slurm-wlm-basic-plugins`` and what the fabric needs; :func:`slurm_unavailable`
says why not.
"""

from __future__ import annotations

import grp
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .netns import NetnsFabric, netns_unavailable
from .traverse import grant_traverse, revoke_traverse

BINARIES = ("slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "sinfo", "munged",
            "nsenter", "runuser")
PLUGIN_DIRS = ("/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm",
               "/usr/lib/slurm-wlm", "/usr/lib64/slurm", "/usr/lib/slurm")
TEST_USER = "stagerbb"
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


class SlurmError(RuntimeError):
    """Slurm could not be started, or a command of it failed."""


def slurm_unavailable() -> str | None:
    """Why a test Slurm cannot run here, or ``None`` when it can."""
    if os.geteuid() != 0:
        return "a test Slurm needs root (network namespaces, munged, slurmd)"
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return (f"not installed: {' '.join(missing)} (Debian: slurmctld slurmd slurm-client "
                "munge util-linux)")
    if not any(Path(d, "burst_buffer_lua.so").exists() for d in PLUGIN_DIRS):
        return "burst_buffer_lua.so not found (Debian: slurm-wlm-basic-plugins)"
    return netns_unavailable()


def ensure_user(name: str = TEST_USER) -> pwd.struct_passwd:
    """An unprivileged user that submits test jobs, made when missing."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--user-group", "--no-create-home",
                        "--shell", "/bin/sh", name], check=True, capture_output=True)
        return pwd.getpwnam(name)


def ensure_group(name: str, members: tuple[str, ...] = ()) -> grp.struct_group:
    """A Unix group with (at least) ``members`` as supplementary members, made when
    missing; members are users (:func:`ensure_user`)."""
    try:
        grp.getgrnam(name)
    except KeyError:
        subprocess.run(["groupadd", "--system", name], check=True, capture_output=True)
    for member in members:
        if member not in grp.getgrnam(name).gr_mem:
            subprocess.run(["usermod", "--append", "--groups", name, member], check=True,
                           capture_output=True)
    return grp.getgrnam(name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def parse_record(text: str) -> dict[str, str]:
    """``scontrol show -o`` output (``Key=Value Key=Value …``) as a dict; a value may hold
    spaces only where the next word has no ``=`` (``Reason=…``, ``Command=…``)."""
    out: dict[str, str] = {}
    key = ""
    for word in text.split():
        name, sep, value = word.partition("=")
        if sep and name and name[0].isupper():
            key = name
            out[key] = value
        elif key:
            out[key] += " " + word
    return out


class SlurmCluster:
    """``nodes`` slurmd (``n0``…) and a slurmctld, with burst buffers from ``bb_lua``
    (a Lua script's text) and ``bb_conf`` (``burst_buffer.conf``'s text)."""

    def __init__(self, nodes: int = 3, *, bb_lua: str | None = None, bb_conf: str | None = None,
                 job_submit_lua: str | None = None,
                 user: str = TEST_USER, start_timeout: float = 60.0,
                 keep: bool = bool(os.environ.get("STAGER_KEEP_SLURM")),
                 extra_conf: tuple[str, ...] = ()) -> None:
        """``job_submit_lua``: a ``job_submit.lua`` (``JobSubmitPlugins=lua``), beside
        the burst-buffer script; ``keep``: leave the cluster's directory (logs, state)
        behind at :meth:`down`; ``extra_conf``: more ``slurm.conf`` lines (``Epilog=…``)."""
        self.n = nodes
        self.bb_lua, self.bb_conf = bb_lua, bb_conf
        self.job_submit_lua = job_submit_lua
        self.user = user
        self.start_timeout = start_timeout
        self.keep = keep
        self.extra_conf = extra_conf
        self.fabric = NetnsFabric(nodes, rate_mbit=None)
        self.root = Path()
        self.conf = Path()
        self.name = f"st{os.getpid() % 100000}x{int(time.time()) % 1000}"
        self._procs: list[subprocess.Popen[bytes]] = []
        self.uid = self.gid = -1
        self._granted: list[tuple[str, str]] = []

    # -- paths ---------------------------------------------------------------------
    @property
    def work(self) -> Path:
        """A directory the submitting user owns: job scripts, their output."""
        return self.root / "work"

    @property
    def bridge_address(self) -> str:
        """The controller's (root namespace's) address, reachable from every node."""
        return self.fabric.host_address

    def node_address(self, i: int) -> str:
        return self.fabric.nodes[i].address

    def log(self, name: str) -> str:
        """A daemon's log (``ctld``, ``slurmd-n0``, ``munged``), for failure messages."""
        path = self.root / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- lifecycle -----------------------------------------------------------------
    def __enter__(self) -> SlurmCluster:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        reason = slurm_unavailable()
        if reason:
            raise SlurmError(reason)
        user = ensure_user(self.user)
        self.uid, self.gid = user.pw_uid, user.pw_gid
        self.root = Path(tempfile.mkdtemp(prefix="stager-slurm-"))
        self.root.chmod(0o755)
        try:
            # the job's tasks (and the hooks, once they drop root) run this interpreter
            self._granted = grant_traverse(self.uid, [sys.executable, __file__])
            self.fabric.up()
            for sub in ("log", "state", "spool", "etc", "munge", "work"):
                (self.root / sub).mkdir()
            (self.root / "state").chmod(0o700)
            os.chown(self.work, self.uid, self.gid)
            self._start_munged()
            self._write_config()
            self._start_ctld()
            for i in range(self.n):
                self._start_slurmd(i)
            self.wait_idle()
        except BaseException:
            self.down()
            raise

    def down(self, grace: float = 3.0) -> None:
        """Stop every daemon (SIGTERM, then SIGKILL after ``grace``), with their
        descendants, and remove the namespaces.  Idempotent."""
        procs, self._procs = self._procs, []
        pids = {p.pid for p in procs}
        for pid in list(pids):
            pids |= descendants(pid)
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for pid in list(pids):          # hook scripts and job steps started meanwhile too
            pids |= descendants(pid)
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self.fabric.down()          # and whatever still runs inside the namespaces
        revoke_traverse(self._granted)
        self._granted = []
        if not self.keep and self.root != Path() and self.root.exists():
            shutil.rmtree(self.root, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What :meth:`down` should have removed and did not: processes whose command
        line names this cluster's directory, namespaces and links of its fabric."""
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(self.root) in cmdline and self.root != Path():
                found.append(f"process {entry.name}: {cmdline.strip()}")
        return found + self.fabric.leftovers()

    def _spawn(self, argv: list[str], log: str, env: dict[str, str] | None = None
               ) -> subprocess.Popen[bytes]:
        with open(self.root / "log" / f"{log}.out", "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
        self._procs.append(proc)
        return proc

    def _start_munged(self) -> None:
        d = self.root / "munge"
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        munge = pwd.getpwnam("munge")
        for path in (d, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        d.chmod(0o755)
        self.munge_socket = d / "munge.socket"
        self._spawn(["runuser", "-u", "munge", "--", "munged", "--foreground", "--force",
                     f"--socket={self.munge_socket}", f"--key-file={key}",
                     f"--pid-file={d / 'munged.pid'}", f"--seed-file={d / 'munged.seed'}",
                     f"--log-file={self.root / 'log' / 'munged.log'}"], "munged")
        self._wait(lambda: self.munge_socket.exists(), "munged to listen", 10)

    def _write_config(self) -> None:
        etc = self.root / "etc"
        self.conf = etc / "slurm.conf"
        self.ctld_port, self.slurmd_port = free_port(), free_port()
        r = self.root
        nodes = [f"NodeName=n{i} NodeAddr={self.node_address(i)} CPUs=1 State=UNKNOWN"
                 for i in range(self.n)]
        lines = [
            f"ClusterName={self.name}",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({self.bridge_address})",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={r}/state", f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/slurmctld.pid", f"SlurmdPidFile={r}/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/ctld.log", f"SlurmdLogFile={r}/log/slurmd-%n.log",
            "ProctrackType=proctrack/pgid", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none", "MpiDefault=none",
            "SchedulerType=sched/backfill", "SchedulerParameters=bf_interval=1",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "ReturnToService=2", "MinJobAge=600", "KillWait=2", "SlurmdTimeout=60",
            f"SlurmctldPort={self.ctld_port}", f"SlurmdPort={self.slurmd_port}",
            *self.extra_conf, *nodes,
            f"PartitionName=p Nodes=n[0-{self.n - 1}] Default=YES MaxTime=INFINITE State=UP",
        ]
        if self.bb_lua is not None:
            lines.append("BurstBufferType=burst_buffer/lua")
            (etc / "burst_buffer.lua").write_text(self.bb_lua)
            (etc / "burst_buffer.conf").write_text(self.bb_conf or "Directive=STAGER\n")
        if self.job_submit_lua is not None:
            lines.insert(0, "JobSubmitPlugins=lua")
            (etc / "job_submit.lua").write_text(self.job_submit_lua)
        self.conf.write_text("\n".join(lines) + "\n")

    def _start_ctld(self) -> None:
        self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)], "ctld")
        self._wait(lambda: self.scontrol("ping").returncode == 0
                   and "UP" in self.scontrol("ping").stdout, "slurmctld to answer", 30)

    def _start_slurmd(self, i: int) -> None:
        (self.root / "spool" / f"n{i}").mkdir()
        self._spawn(["nsenter", f"--net=/run/netns/{self.fabric.nodes[i].netns}",
                     "slurmd", "-D", "-f", str(self.conf), "-N", f"n{i}"], f"slurmd-n{i}")

    def wait_idle(self, timeout: float | None = None) -> None:
        """Wait until every node is idle."""
        def idle() -> bool:
            out = self.command(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout.split("\n")
            states = dict(line.split() for line in out if line.strip())
            return len(states) == self.n and all(s == "idle" for s in states.values())
        self._wait(idle, "every node to be idle", timeout or self.start_timeout)

    def _wait(self, ready: object, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():  # type: ignore[operator]
            for p in self._procs:
                if p.poll() is not None:
                    raise SlurmError(f"while waiting for {what}: {shlex.join(p.args)} "  # type: ignore[arg-type]
                                     f"exited with {p.returncode}\n{self.log_tails()}")
            if time.monotonic() > deadline:
                raise SlurmError(f"timed out waiting for {what}\n{self.log_tails()}")
            time.sleep(0.2)

    def log_tails(self, lines: int = 15) -> str:
        out = []
        for path in sorted((self.root / "log").glob("*")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(out)

    # -- commands ------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def command(self, argv: list[str], *, as_user: bool | str = False, timeout: float = 30,
                ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command against this cluster (as the test user with ``as_user``
        ``True``, as the user it names when a name)."""
        if as_user:
            user = self.user if as_user is True else as_user
            argv = ["runuser", "-u", user, "--", "env", f"SLURM_CONF={self.conf}", *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env=self.env(), cwd=self.work if as_user else None)

    def scontrol(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.command(["scontrol", *args])

    def sbatch(self, script: Path, *args: str, user: str | None = None) -> int:
        """Submit ``script`` as the test user (or ``user``); the job id (raises with
        sbatch's message)."""
        proc = self.command(["sbatch", "--parsable", *args, str(script)],
                            as_user=user or True)
        if proc.returncode != 0:
            raise SlurmError(proc.stderr.strip() or f"sbatch exited {proc.returncode}")
        return int(proc.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        proc = self.scontrol("show", "job", "-o", str(job_id))
        if proc.returncode != 0:
            raise SlurmError(proc.stderr.strip())
        return parse_record(proc.stdout)

    def wait_job(self, job_id: int, until: object = None, timeout: float = 120) -> dict[str, str]:
        """Poll the job until it is in a final state (or ``until(record)`` holds)."""
        deadline = time.monotonic() + timeout
        while True:
            record = self.job(job_id)
            if until(record) if until else record.get("JobState") in FINAL_STATES:  # type: ignore[operator]
                return record
            if time.monotonic() > deadline:
                raise SlurmError(f"job {job_id} still {record.get('JobState')} after "
                                 f"{timeout:.0f} s: {record}\n{self.log_tails()}")
            time.sleep(0.3)


@contextmanager
def slurm_for_tests(nodes: int = 3, **options: Any) -> Iterator[SlurmCluster]:
    """A :class:`SlurmCluster` (``options`` as its own) up for the block, for a test
    module's fixture: skips, saying why, where Slurm cannot run here; fails the test
    where it does not start; afterwards down, and nothing of it left behind."""
    import pytest

    reason = slurm_unavailable()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(nodes, **options)
    try:
        cluster.up()
    except SlurmError as exc:
        pytest.fail(f"Slurm did not start: {exc}")
    yield cluster
    cluster.down()
    assert cluster.leftovers() == []


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (by parent links in ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
