"""A real Slurm per test module (``stager.testing.slurm``), with stager's burst-buffer
hooks (and job_submit.lua, which tells them the submitting user on Slurm 22.05), and a
persistent stager cluster with auth its nodes reach over the bridge.

Two Unix users submit: :data:`TEAM_A_USER` (the cluster's test user), a member of the
group :data:`TEAM_A`, whose grants are ``/datasets/team-a`` (read-write) and
``/datasets/reference`` (read-only); :data:`OTHER_USER`, in no such group."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stager import Client
from stager.testing import ThreadCluster
from stager.testing.slurm import (
    TEST_USER,
    SlurmCluster,
    ensure_group,
    ensure_user,
    slurm_for_tests,
    slurm_unavailable,
)

REPO = Path(__file__).resolve().parents[2]
LUA = REPO / "deploy" / "slurm" / "burst_buffer.lua"
JOB_SUBMIT_LUA = REPO / "deploy" / "slurm" / "job_submit.lua"
BB_CONF = REPO / "deploy" / "slurm" / "burst_buffer.conf"
TEAM_A = "stagerteama"          # a Unix group
TEAM_A_USER = TEST_USER         # in it
OTHER_USER = "stagerbb2"        # not in it
GRANTS = {f"@{TEAM_A}": ["/datasets/team-a", "ro:/datasets/reference"]}


def stager_command() -> str:
    """This checkout's ``stager`` as a shell command, the way the hooks must run it."""
    return f"env PYTHONPATH={REPO} {sys.executable} -m stager"


def render_lua(command: str, settings: str | os.PathLike[str]) -> str:
    """deploy/slurm/burst_buffer.lua with its two settings lines pointed elsewhere."""
    text = LUA.read_text()
    text, n = re.subn(r'(?m)^STAGER = ".*"$', f'STAGER = "{command}"', text)
    text, m = re.subn(r'(?m)^STAGER_CONFIG = ".*"$', f'STAGER_CONFIG = "{settings}"', text)
    assert n == m == 1, "burst_buffer.lua's settings lines moved"
    return text


@pytest.fixture(scope="module")
def bb_settings() -> Iterator[Path]:
    """Where the hooks' settings file will be (written once the stager cluster is up)."""
    with tempfile.TemporaryDirectory(prefix="stager-bb-") as tmp:
        yield Path(tmp) / "slurm.toml"


@pytest.fixture(scope="module")
def slurm(bb_settings: Path) -> Iterator[SlurmCluster]:
    """Slurm with 3 nodes n0..n2, each in its own network namespace, and stager's
    burst-buffer hooks; skips, saying why, where Slurm cannot run here."""
    if not slurm_unavailable():
        ensure_user(TEAM_A_USER)
        ensure_user(OTHER_USER)
        ensure_group(TEAM_A, (TEAM_A_USER,))
    bb_conf = BB_CONF.read_text().replace("86400", "120")
    # sbatch waits for job_submit.lua and slurm_bb_job_process, each a stager start-up
    # (seconds apiece on 2 loaded cores): Slurm's 10 s default timed sbatch out
    with slurm_for_tests(3, bb_lua=render_lua(stager_command(), bb_settings),
                         bb_conf=bb_conf, job_submit_lua=JOB_SUBMIT_LUA.read_text(),
                         extra_conf=("MessageTimeout=60",)) as cluster:
        yield cluster
        end_detached_hooks(cluster)


def end_detached_hooks(cluster: SlurmCluster, grace: float = 30) -> None:
    """Wait for the hooks burst_buffer.lua runs in a session of their own (teardown),
    which the cluster's shutdown cannot reach as its daemons' descendants, and kill
    what still runs after ``grace``."""
    deadline = time.monotonic() + grace
    while (pids := hook_processes(cluster)) and time.monotonic() < deadline:
        time.sleep(0.3)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def hook_processes(cluster: SlurmCluster, *words: str) -> list[int]:
    """``stager slurm …`` processes of this cluster's hooks (their job script is in its
    state directory), those with each of ``words`` among their arguments."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if (b"slurm" in argv and any(str(cluster.root).encode() in a for a in argv)
                and all(w.encode() in argv for w in words)):
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def persistent(slurm: SlurmCluster, bb_settings: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    """A stager cluster with auth on the bridge address, reachable from every node; the
    hooks' settings point at it, with its admin token (root's, 0600) and :data:`GRANTS`."""
    cluster = ThreadCluster(tmp_path_factory.mktemp("persistent"), 3, auth=True,
                            host=slurm.bridge_address)
    cluster.start()
    state = bb_settings.parent / "state"
    admin = bb_settings.parent / "slurm.token"
    admin.write_text(cluster.admin_token + "\n")
    admin.chmod(0o600)
    grants = "".join(f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in GRANTS.items())
    bb_settings.write_text(f'meta_url = "{cluster.meta_url}"\njobs_dir = "/jobs"\n'
                           f'state_dir = "{state}"\ntoken_file = "{admin}"\n'
                           f'job_token_ttl = 3600\n[grants]\n{grants}')
    bb_settings.parent.chmod(0o755)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def admin(persistent: ThreadCluster) -> Iterator[Client]:
    """A client of the persistent cluster with its admin token."""
    with Client(persistent.meta_url, token=persistent.admin_token) as client:
        yield client
