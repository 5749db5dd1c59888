"""The processes of a per-job cluster on one node: started, recorded, found, stopped.

Every server ``stager job up`` starts carries ``STAGER_JOB_ID`` and
``STAGER_JOB_NODE`` in its environment, and its pid goes into a record,
``RUN_DIR/stager-job-ID.NODE.json`` (``RUN_DIR`` is ``/tmp`` unless
``--run-dir``/``STAGER_JOB_RUN_DIR`` says otherwise), next to the node-local
root it uses.  :func:`stop_node` (``stager job down``, and the Slurm epilog
that calls it) kills exactly those processes: the recorded pids and whatever
``/proc`` shows carrying the job's variables (so a server started just before a
``kill -9`` of ``job up`` is found too), each checked by its environment before
a signal, so a reused pid is never hit.  Then it removes the root.

Run as root (the epilog), :func:`stop_node` acts only for the job's user: the
record, the processes and the directories it removes must belong to ``uid``.
"""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BadRequest

STOP_GRACE = 10.0       # seconds servers get to exit on SIGTERM before SIGKILL
JOB_VAR, NODE_VAR = "STAGER_JOB_ID", "STAGER_JOB_NODE"
# In the job directory: a failed `job up` leaves these for the user, also past job down
FAILED_FILE, LOGS_DIR = "failed", "logs"


def run_dir(given: str | None = None, env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(given or env.get("STAGER_JOB_RUN_DIR") or "/tmp")


def record_path(where: Path, job_id: str, node: str) -> Path:
    return where / f"stager-job-{job_id}.{node}.json"


@dataclass
class NodeRecord:
    """What ``job up`` started on one node, kept where ``job down`` and the epilog look."""

    job_id: str
    node: str
    root: str                 # the node-local root (removed by job down)
    job_dir: str              # the shared job directory (removed by node 0's job down)
    first: bool               # node 0: runs the metadata server, owns the job directory
    pids: list[int] = field(default_factory=list)

    def save(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.__dict__))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> NodeRecord:
        body: dict[str, Any] = json.loads(path.read_text())
        return cls(**body)


def _die_with_parent() -> None:
    """A foreground ``job up`` takes its servers with it, even when SIGKILLed."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def spawn(argv: list[str], log: Path, job_id: str, node: str, *,
          foreground: bool, hold: int = -1) -> subprocess.Popen[bytes]:
    """``python -m stager ARGV`` in a session of its own, logging to ``log``; it
    inherits the descriptor ``hold`` (the root's lock), which it holds while it lives.

    Daemonized (the default) it outlives the ``srun`` step: a new session leaves the
    step's process group (``proctrack/pgid``) and, once ``job up`` exits, its
    parentage (``proctrack/linuxproc``).  Under ``proctrack/cgroup`` nothing leaves
    the step: use ``--foreground`` there (see deploy/README.md)."""
    env = {**os.environ, JOB_VAR: job_id, NODE_VAR: node}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "stager", *argv], env=env,
                                stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                pass_fds=(hold,) if hold >= 0 else (),
                                preexec_fn=_die_with_parent if foreground else None)


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def _owner(path: Path) -> int | None:
    try:
        return path.lstat().st_uid
    except OSError:
        return None


def job_processes(job_id: str, node: str, uid: int | None = None,
                  candidates: list[int] | None = None) -> list[int]:
    """Pids of the live processes of ``job_id`` on ``node`` (by their environment):
    ``candidates`` checked, and every other process ``/proc`` lists."""
    seen = set(candidates or ())
    seen.update(int(e.name) for e in os.scandir("/proc") if e.name.isdigit())
    seen.discard(os.getpid())
    found = []
    for pid in sorted(seen):
        env = _environ(pid)
        if env.get(JOB_VAR) != job_id or env.get(NODE_VAR) != node:
            continue
        if uid is not None and _owner(Path(f"/proc/{pid}")) != uid:
            continue
        found.append(pid)
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (one of another user's too); a zombie does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (our own child, not yet reaped) is gone for every purpose here
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_job_processes(job_id: str, node: str, uid: int | None = None,
                       candidates: list[int] | None = None,
                       grace: float = STOP_GRACE) -> list[int]:
    """SIGTERM the job's processes on ``node``, SIGKILL what outlives ``grace``;
    returns the pids it signalled."""
    pids = job_processes(job_id, node, uid, candidates)
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in pids if pid_alive(p)]
    _signal_all(left, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while any(pid_alive(p) for p in left) and time.monotonic() < deadline:
        time.sleep(0.02)
    return pids


def _remove_tree(path: Path, uid: int | None) -> bool:
    """Remove ``path`` (never following a link out of it), if ``uid`` owns it; run as
    root for another user, with that user's rights only (in a child that drops root)."""
    if not path.exists() and not path.is_symlink():
        return False
    if uid is not None and _owner(path) != uid:
        raise PermissionError(f"{path} does not belong to uid {uid}: left in place")
    if uid is None or uid == os.geteuid() or os.geteuid() != 0:
        _unlink_tree(path)
        return True
    # rm, like _unlink_tree, removes a link itself and never what it points to
    done = subprocess.run(["rm", "-rf", "--", str(path)], user=uid, group=_gid_of(uid),
                          extra_groups=[], capture_output=True, text=True, check=False)
    if done.returncode != 0 or path.exists() or path.is_symlink():
        raise PermissionError(f"could not remove {path} as uid {uid}: "
                              f"{done.stderr.strip()}")
    return True


def _unlink_tree(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    else:
        shutil.rmtree(path)


def _gid_of(uid: int) -> int:
    gid = os.environ.get("SLURM_JOB_GID")
    if gid and gid.isdigit():
        return int(gid)
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


@dataclass
class StopReport:
    killed: list[int] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)      # a failed job up's logs


def _empty_job_dir(job_dir: Path, uid: int | None, report: StopReport) -> None:
    """Remove the job directory, or, where ``job up`` failed, all of it but
    ``failed`` and ``logs/``: the user's only account of why, read after the job."""
    if not (job_dir / FAILED_FILE).is_file() or job_dir.is_symlink():
        if _remove_tree(job_dir, uid):
            report.removed.append(str(job_dir))
        return
    if uid is not None and _owner(job_dir) != uid:
        raise PermissionError(f"{job_dir} does not belong to uid {uid}: left in place")
    for entry in sorted(job_dir.iterdir()):
        if entry.name in (FAILED_FILE, LOGS_DIR):
            report.kept.append(str(entry))
        elif _remove_tree(entry, uid):
            report.removed.append(str(entry))


def stop_node(job_id: str, node: str, where: Path, *, uid: int | None = None,
              root: str | None = None, keep_job_dir: bool = False,
              grace: float = STOP_GRACE) -> StopReport:
    """Stop this node's part of the job and remove its files (see the module docstring).

    ``root`` is removed when no record names one (``job up`` killed before it wrote
    its record); node 0's record also names the job directory, removed with it
    (but for a failed ``job up``'s ``failed`` and ``logs/``)."""
    path = record_path(where, job_id, node)
    record = None
    if path.exists():
        if uid is not None and _owner(path) != uid:
            raise BadRequest(f"{path} does not belong to the job's user (uid {uid})")
        record = NodeRecord.load(path)
    report = StopReport()
    report.killed = kill_job_processes(job_id, node, uid, record.pids if record else None,
                                       grace)
    roots = [Path(record.root)] if record else [Path(root)] if root else []
    for tree in roots:
        if _remove_tree(tree, uid):
            report.removed.append(str(tree))
    if record and record.first and not keep_job_dir:
        _empty_job_dir(Path(record.job_dir), uid, report)
    path.unlink(missing_ok=True)
    return report
