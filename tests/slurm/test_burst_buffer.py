"""Burst-buffer staging on a real Slurm: ``#STAGER`` directives in a batch script
stage a dataset in before the job starts, a 3-node job's ranks read it through
the Loader, results are staged out after it, and the job's directory goes."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stager import Client
from stager.testing import ThreadCluster
from stager.testing.httpserver import HttpServer
from stager.testing.slurm import SlurmCluster, SlurmError

from .conftest import REPO

pytestmark = pytest.mark.slow      # a real Slurm: about a minute for the module

SAMPLES = 30
TRAIN = '''
import hashlib, json, os, socket
from stager import Client, Loader

rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
job_dir = os.environ["STAGER_JOB_DIR"]
loader = Loader(f"{job_dir}/in", batch_size=4, rank=rank, world_size=world, seed=1,
                format="files", drop_last=False, report=False)
read = [[s["__key__"], hashlib.sha256(s["data"]).hexdigest()] for b in loader for s in b]
loader.close()
with Client() as c:
    c.pipe(f"{job_dir}/out/rank{rank}.json", json.dumps({
        "rank": rank, "world": world, "node": os.environ["SLURMD_NODENAME"],
        "meta": os.environ["STAGER_META_URL"], "read": read}).encode())
'''


@pytest.fixture(scope="module")
def source(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[str, dict[str, str]]]:
    """A dataset served over HTTP on the bridge: its URL, and each sample's sha256."""
    root = tmp_path_factory.mktemp("source")
    data = root / "ds"
    digests = {}
    for i in range(SAMPLES):
        body = f"sample {i} ".encode() * (50 + i)
        path = data / f"part{i % 3}" / f"s{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        path.chmod(0o644)
        digests[f"part{i % 3}/s{i:03d}.bin"] = hashlib.sha256(body).hexdigest()
    (data / "README.txt").write_text("not a sample")
    (data / "README.txt").chmod(0o644)
    with HttpServer(root, host=slurm.bridge_address) as server:
        yield server.url, digests


def job_script(slurm: SlurmCluster, name: str, directives: str, body: str) -> Path:
    script = slurm.work / f"{name}.sh"
    script.write_text("#!/bin/sh\n#SBATCH --nodes=3 --ntasks=3 --ntasks-per-node=1\n"
                      f"#SBATCH --output={slurm.work}/{name}-%j.out\n"
                      f"{directives.strip()}\n\nexport PYTHONPATH={REPO}\n{body}\n")
    script.chmod(0o644)
    return script


def wait_gone(client: Client, path: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while client.exists(path):
        assert time.monotonic() < deadline, f"{path} still there after {timeout} s"
        time.sleep(0.3)


def test_a_three_node_job_reads_its_staged_dataset_once_and_stages_results_out(
        slurm: SlurmCluster, persistent: ThreadCluster,
        source: tuple[str, dict[str, str]]) -> None:
    url, digests = source
    results = slurm.work / "results"
    results.mkdir()
    os.chown(results, slurm.uid, slurm.gid)
    (slurm.work / "train.py").write_text(TRAIN)
    script = job_script(slurm, "train", f"""
#STAGER stage_in {url}/ds /jobs/$SLURM_JOB_ID/in --include '*.bin'
#STAGER stage_out /jobs/$SLURM_JOB_ID/out file://{results}
""", f"srun -n 3 {sys.executable} {slurm.work}/train.py")
    job = slurm.sbatch(script)
    record = slurm.wait_job(job, timeout=180)
    output = (slurm.work / f"train-{job}.out")
    assert record["JobState"] == "COMPLETED", (record, output.read_text() if output.exists()
                                               else "", slurm.log_tails())
    assert record["ExitCode"] == "0:0"
    # data_out runs after the job ends: its files appear whole, one by one
    deadline = time.monotonic() + 60
    while len(list(results.glob("rank*.json"))) < 3:
        assert time.monotonic() < deadline, (slurm.job(job), slurm.log_tails())
        time.sleep(0.3)
    ranks = [json.loads((results / f"rank{r}.json").read_text()) for r in range(3)]
    assert sorted(r["node"] for r in ranks) == ["n0", "n1", "n2"]
    assert {r["meta"] for r in ranks} == {persistent.meta_url}
    read = [tuple(item) for r in ranks for item in r["read"]]
    assert len(read) == SAMPLES                              # every sample once ...
    assert dict(read) == digests                             # ... byte-exact, and only *.bin
    assert all(r["read"] for r in ranks)                     # every rank had a shard
    with Client(persistent.meta_url) as client:              # teardown: the job's dir goes
        wait_gone(client, f"/jobs/{job}")


def test_a_malformed_directive_rejects_the_job_naming_its_line(slurm: SlurmCluster,
                                                                persistent: ThreadCluster
                                                                ) -> None:
    script = job_script(slurm, "bad", "#STAGER stagein http://x/y /jobs/$SLURM_JOB_ID/in",
                        "true")
    with pytest.raises(SlurmError) as err:
        slurm.sbatch(script)
    message = str(err.value)
    assert "line 4" in message and "unknown directive 'stagein'" in message, message


def test_a_source_no_backend_can_open_rejects_the_job(slurm: SlurmCluster,
                                                      persistent: ThreadCluster) -> None:
    script = job_script(slurm, "proto", "#STAGER stage_in nosuch://x/y in", "true")
    with pytest.raises(SlurmError) as err:
        slurm.sbatch(script)
    assert "line 4" in str(err.value) and "unknown protocol 'nosuch'" in str(err.value)


def test_a_missing_source_holds_the_job_with_the_reason(
        slurm: SlurmCluster, persistent: ThreadCluster,
        source: tuple[str, dict[str, str]]) -> None:
    url, _ = source
    script = job_script(slurm, "missing",
                        f"#STAGER stage_in {url}/no-such-dataset /jobs/$SLURM_JOB_ID/in",
                        "echo ran")
    job = slurm.sbatch(script)
    record = slurm.wait_job(job, until=lambda r: "data_in" in r.get("Reason", ""), timeout=60)
    try:
        assert record["JobState"] == "PENDING", record
        assert "no-such-dataset" in record["Reason"], record
        assert not (slurm.work / f"missing-{job}.out").exists()     # it never ran
    finally:
        slurm.command(["scancel", str(job)])
    with Client(persistent.meta_url) as client:
        wait_gone(client, f"/jobs/{job}")


def test_a_job_cancelled_mid_run_has_its_directory_torn_down(
        slurm: SlurmCluster, persistent: ThreadCluster,
        source: tuple[str, dict[str, str]]) -> None:
    url, digests = source
    script = job_script(slurm, "cancelled", f"#STAGER stage_in {url}/ds in", "sleep 300")
    job = slurm.sbatch(script)
    slurm.wait_job(job, until=lambda r: r["JobState"] == "RUNNING", timeout=60)
    with Client(persistent.meta_url) as client:
        staged = {f.path for f in client.walk(f"/jobs/{job}/in")}
        assert {f"/jobs/{job}/in/{k}" for k in digests} <= staged   # in before it ran
        assert slurm.command(["scancel", str(job)], as_user=True).returncode == 0
        assert slurm.wait_job(job)["JobState"] == "CANCELLED"
        wait_gone(client, f"/jobs/{job}")
