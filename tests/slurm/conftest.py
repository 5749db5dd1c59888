"""A real Slurm per test module (``stager.testing.slurm``), with stager's burst-buffer
hooks, and a persistent stager cluster its nodes reach over the bridge."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stager.testing import ThreadCluster
from stager.testing.slurm import SlurmCluster, slurm_for_tests

REPO = Path(__file__).resolve().parents[2]
LUA = REPO / "deploy" / "slurm" / "burst_buffer.lua"
BB_CONF = REPO / "deploy" / "slurm" / "burst_buffer.conf"


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
    bb_conf = BB_CONF.read_text().replace("86400", "120")
    with slurm_for_tests(3, bb_lua=render_lua(stager_command(), bb_settings),
                         bb_conf=bb_conf) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def persistent(slurm: SlurmCluster, bb_settings: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    """A stager cluster on the bridge address, reachable from every node; the hooks'
    settings point at it."""
    cluster = ThreadCluster(tmp_path_factory.mktemp("persistent"), 3,
                            host=slurm.bridge_address, insecure=True)
    cluster.start()
    state = bb_settings.parent / "state"
    bb_settings.write_text(f'meta_url = "{cluster.meta_url}"\njobs_dir = "/jobs"\n'
                           f'state_dir = "{state}"\n')
    bb_settings.parent.chmod(0o755)
    yield cluster
    cluster.stop()
