"""``stager job up`` on a real Slurm: a per-job cluster on 3 nodes, and the epilog.

The nodes are ``slurmd`` in their own network namespaces (``stager.testing.slurm``);
``srun --ntasks-per-node=1 stager job up`` starts the cluster inside the job, the
ranks of a later step read the staged dataset, and when the job ends (completed,
or cancelled with ``scancel`` mid-run) nothing of it is left on any node: the
epilog (deploy/slurm/epilog.sh, slurm.conf's ``Epilog=``) runs ``stager job down``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stager.testing.slurm import SlurmCluster, slurm_for_tests

from .conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]  # one Slurm at a time
EPILOG = REPO / "deploy" / "slurm" / "epilog.sh"
FILES = 24
READ = '''
import hashlib, json, os, sys
from stager import Client
rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
with Client() as client:
    paths = sorted(f.path for f in client.walk("/ds"))
    read = {p: hashlib.sha256(client.cat(p)).hexdigest() for p in paths[rank::world]}
out = {"node": os.environ["SLURMD_NODENAME"], "meta": os.environ["STAGER_META_URL"],
       "read": read}
with open(f"{sys.argv[1]}-{rank}.json", "w") as f:
    json.dump(out, f)
'''


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    """Slurm with 3 nodes whose epilog is deploy/slurm/epilog.sh, run with this checkout."""
    with tempfile.TemporaryDirectory(prefix="stager-epilog-") as tmp:
        wrapper = Path(tmp) / "epilog.sh"
        wrapper.write_text(f"#!/bin/sh\nexport STAGER='env PYTHONPATH={REPO} "
                           f"{sys.executable} -m stager'\nexec sh {EPILOG}\n")
        wrapper.chmod(0o755)
        Path(tmp).chmod(0o755)
        with slurm_for_tests(3, extra_conf=(f"Epilog={wrapper}",)) as cluster:
            yield cluster


@pytest.fixture(scope="module")
def dataset(slurm: SlurmCluster) -> dict[str, str]:
    """A directory standing for the shared tier: its files' digests by stager path."""
    src = slurm.work / "shared"
    digests = {}
    for i in range(FILES):
        body = os.urandom(3000 * i + 11)
        path = src / f"part{i % 2}" / f"s{i:02d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        digests[f"/ds/part{i % 2}/s{i:02d}.bin"] = hashlib.sha256(body).hexdigest()
    return digests


def job_script(slurm: SlurmCluster, name: str, body: str) -> Path:
    """A 3-node job: `stager job up` on every node (each emulated node's local root is
    its own directory: they share this machine's /tmp), then ``body``."""
    py = f"{sys.executable} -m stager"
    script = slurm.work / f"{name}.sh"
    script.write_text(f"""#!/bin/sh
#SBATCH --nodes=3 --ntasks=3 --ntasks-per-node=1
#SBATCH --output={slurm.work}/{name}-%j.out
set -e
export PYTHONPATH={REPO}
srun --ntasks-per-node=1 sh -c 'exec {py} job up --stage-in {slurm.work}/shared /ds \\
    --root {slurm.work}/local-$SLURMD_NODENAME/stager'
eval "$({py} job env)"
{body}
""")
    script.chmod(0o644)
    (slurm.work / "read.py").write_text(READ)
    return script


def job_leftovers(slurm: SlurmCluster, job: int) -> tuple[list[int], list[str]]:
    """(live processes of the job's cluster, its files on nodes and in the job dir)."""
    procs = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                env = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"STAGER_JOB_ID={job}".encode() in env:
                procs.append(int(entry.name))
    files = [str(p) for p in slurm.work.glob("local-*/stager")]
    files += [str(p) for p in slurm.work.glob(f".stager-job-{job}")]
    files += [str(p) for p in Path("/tmp").glob(f"stager-job-{job}.*.json")]
    return procs, files


def job_story(slurm: SlurmCluster, name: str, job: int, lines: int = 40) -> str:
    """What a failed assertion about ``job`` shows: Slurm's record of it, the tail of
    its own output (``job up``'s error is there), the job directory's ``failed`` and
    the tails of its servers' logs, then the Slurm daemons' logs."""
    def tail(path: Path) -> str:
        text = path.read_text(errors="replace") if path.exists() else "(none)"
        return f"--- {path}\n" + "\n".join(text.splitlines()[-lines:])

    job_dir = slurm.work / f".stager-job-{job}"
    logs = sorted((job_dir / "logs").glob("*.log")) if job_dir.exists() else []
    parts = [f"job {job}: {slurm.job(job)}", tail(slurm.work / f"{name}-{job}.out"),
             tail(job_dir / "failed"), *(tail(p) for p in logs), slurm.log_tails()]
    return "\n".join(parts)


def wait_clean(slurm: SlurmCluster, job: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while job_leftovers(slurm, job) != ([], []):
        assert time.monotonic() < deadline, (job_leftovers(slurm, job), slurm.log_tails())
        time.sleep(0.3)


def test_a_per_job_cluster_on_three_nodes_is_read_by_every_rank_and_goes(
        slurm: SlurmCluster, dataset: dict[str, str]) -> None:
    script = job_script(slurm, "percluster", f"""
srun -n 3 {sys.executable} {slurm.work}/read.py {slurm.work}/read-$SLURM_JOB_ID
srun --ntasks-per-node=1 {sys.executable} -m stager job down
""")
    job = slurm.sbatch(script)
    record = slurm.wait_job(job, timeout=240)
    assert record["JobState"] == "COMPLETED", job_story(slurm, "percluster", job)
    ranks = [json.loads((slurm.work / f"read-{job}-{r}.json").read_text()) for r in range(3)]
    assert sorted(r["node"] for r in ranks) == ["n0", "n1", "n2"]
    # the cluster's metadata server ran on the job's first node, at that node's address
    assert {r["meta"] for r in ranks} == {ranks[0]["meta"]}
    assert ranks[0]["meta"].startswith(f"http://{slurm.node_address(0)}:")
    read = [item for r in ranks for item in r["read"].items()]
    assert len(read) == FILES and dict(read) == dataset       # every file once, exact
    wait_clean(slurm, job)


def test_a_cancelled_job_leaves_nothing_once_the_epilog_ran(
        slurm: SlurmCluster, dataset: dict[str, str]) -> None:
    script = job_script(slurm, "cancelled", "sleep 300")
    job = slurm.sbatch(script)
    ready = slurm.work / f".stager-job-{job}" / "cluster.json"
    deadline = time.monotonic() + 180
    while not ready.exists():
        assert time.monotonic() < deadline, job_story(slurm, "cancelled", job)
        assert slurm.job(job)["JobState"] in ("PENDING", "RUNNING", "CONFIGURING"), \
            job_story(slurm, "cancelled", job)
        time.sleep(0.3)
    procs, files = job_leftovers(slurm, job)
    assert len(procs) == 4 and len(files) >= 3           # servers up, roots on every node
    assert slurm.command(["scancel", str(job)], as_user=True).returncode == 0
    assert slurm.wait_job(job, timeout=60)["JobState"] == "CANCELLED"
    wait_clean(slurm, job)
