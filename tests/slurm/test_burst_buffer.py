"""Burst-buffer staging on a real Slurm: ``#STAGER`` directives in a batch script
stage a dataset in before the job starts, a 3-node job's ranks read it through
the Loader, results are staged out after it, and the job's directory goes.

A job reaches only its directory and what ``slurm.toml``'s ``[grants]`` give its
Unix user or groups (conftest: group team-a); anything else rejects it at sbatch.
Staging runs with per-job tokens on exactly the staged paths, never the admin's."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stager import Client
from stager.testing import ThreadCluster
from stager.testing.httpserver import HttpServer
from stager.testing.slurm import SlurmCluster, SlurmError

from .conftest import OTHER_USER, REPO, TEAM_A, hook_processes, running

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]  # one Slurm at a time

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
        slurm: SlurmCluster, persistent: ThreadCluster, admin: Client,
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
    wait_gone(admin, f"/jobs/{job}")                         # teardown: the job's dir goes


def test_a_job_reads_an_attached_and_warmed_dataset_and_teardown_detaches_it(
        slurm: SlurmCluster, persistent: ThreadCluster, admin: Client,
        source: tuple[str, dict[str, str]]) -> None:
    """Issue 28: ``#STAGER attach`` instead of a copy: attached and warmed before the
    job starts (every byte cached), read by a 3-node job's Loader, detached after it;
    ``capacity=`` is the job directory's quota while it runs."""
    url, digests = source
    results = slurm.work / "attach-results"
    results.mkdir()
    os.chown(results, slurm.uid, slurm.gid)
    (slurm.work / "train.py").write_text(TRAIN)
    # the job waits (at most 2 min) until the test has seen it running, attached and warm
    go = slurm.work / "attached.go"
    hold = f"for i in $(seq 1200); do [ -e {go} ] && break; sleep 0.1; done"
    script = job_script(slurm, "attached", f"""
#STAGER attach {url}/ds /jobs/$SLURM_JOB_ID/in --include '*.bin'
#STAGER capacity=1MiB
#STAGER stage_out /jobs/$SLURM_JOB_ID/out file://{results}
""", f"{hold}\nsrun -n 3 {sys.executable} {slurm.work}/train.py")
    job = slurm.sbatch(script)
    running = slurm.wait_job(job, until=lambda r: r["JobState"] not in ("PENDING",
                                                                         "CONFIGURING"),
                             timeout=120)
    assert running["JobState"] == "RUNNING", (running, slurm.log_tails())
    [view] = [a for a in admin.attachments() if a.path == f"/jobs/{job}/in"]
    assert (view.files, view.cached_bytes) == (len(digests), view.bytes), view    # warm
    assert {q.path: q.bytes for q in admin.quotas()}.get(f"/jobs/{job}") == 1 << 20
    go.touch()                                  # seen while it ran: now it may read
    record = slurm.wait_job(job, timeout=180)
    output = slurm.work / f"attached-{job}.out"
    assert record["JobState"] == "COMPLETED", (record, output.read_text() if output.exists()
                                               else "", slurm.log_tails())
    deadline = time.monotonic() + 60
    while len(list(results.glob("rank*.json"))) < 3:
        assert time.monotonic() < deadline, (slurm.job(job), slurm.log_tails())
        time.sleep(0.3)
    read = [tuple(item) for r in range(3)
            for item in json.loads((results / f"rank{r}.json").read_text())["read"]]
    assert len(read) == len(digests) and dict(read) == digests      # once each, exact
    wait_gone(admin, f"/jobs/{job}")
    assert f"/jobs/{job}/in" not in {a.path for a in admin.attachments()}
    minted = {t.name: t for t in admin.list_tokens() if t.name.startswith(f"slurm-job-{job}")}
    assert minted[f"slurm-job-{job}-attach"].scopes == ("admin",)
    assert minted[f"slurm-job-{job}-attach"].prefixes == (f"/jobs/{job}/in",)
    deadline = time.monotonic() + 30
    while not all(t.revoked for t in minted.values()):
        assert time.monotonic() < deadline, minted
        time.sleep(0.3)
        minted = {t.name: t for t in admin.list_tokens()
                  if t.name.startswith(f"slurm-job-{job}")}


def test_a_job_asking_more_capacity_than_is_free_waits(
        slurm: SlurmCluster, persistent: ThreadCluster, admin: Client) -> None:
    """The pool Slurm draws ``capacity=`` from is the cluster's free bytes
    (``slurm_bb_pools``): a job that asks for more waits, and never starts staging.
    Slurm takes a capacity only with its pool named; job_submit.lua names stager's."""
    free = sum(t["capacity"] - t["used"] for t in admin.status()["targets"])
    script = job_script(slurm, "huge", f"#STAGER capacity={2 * free}", "echo ran")
    job = slurm.sbatch(script)
    try:
        record = slurm.wait_job(job, until=lambda r: r.get("Reason") == "BurstBufferResources",
                                timeout=60)
        time.sleep(3)
        record = slurm.job(job)
        assert (record["JobState"], record["Reason"]) == ("PENDING", "BurstBufferResources")
        assert not admin.exists(f"/jobs/{job}")                  # nothing set up for it
    finally:
        slurm.command(["scancel", str(job)])


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
        slurm: SlurmCluster, persistent: ThreadCluster, admin: Client,
        source: tuple[str, dict[str, str]]) -> None:
    url, _ = source
    script = job_script(slurm, "missing",
                        f"#STAGER stage_in {url}/no-such-dataset /jobs/$SLURM_JOB_ID/in",
                        "echo ran")
    job = slurm.sbatch(script)
    try:
        record = slurm.wait_job(job, until=lambda r: "data_in" in r.get("Reason", ""),
                                timeout=60)
        assert record["JobState"] == "PENDING", record
        assert "no-such-dataset" in record["Reason"], record
        assert not (slurm.work / f"missing-{job}.out").exists()     # it never ran
        # Flags=TeardownFailure starts a teardown as data_in fails: cancel while it runs
        deadline = time.monotonic() + 60
        while not (first := hook_processes(slurm, "teardown", str(job))):
            if not admin.exists(f"/jobs/{job}") or time.monotonic() > deadline:
                break                   # done already (or never seen: the wait says)
            time.sleep(0.05)
    finally:
        slurm.command(["scancel", str(job)])
    # The scancel kills every script Slurm runs for a pending job, and Slurm never runs
    # again a teardown it killed; the teardown the scancel queues races that kill inside
    # slurmctld. burst_buffer.lua runs stager's teardown in a session of its own: the
    # first one goes on (a killed one would be gone at once, its work not done).
    time.sleep(0.5)
    assert any(running(pid) for pid in first) or not admin.exists(f"/jobs/{job}"), first
    wait_gone(admin, f"/jobs/{job}", timeout=120)


def test_a_job_cancelled_mid_run_has_its_directory_torn_down(
        slurm: SlurmCluster, persistent: ThreadCluster, admin: Client,
        source: tuple[str, dict[str, str]]) -> None:
    url, digests = source
    script = job_script(slurm, "cancelled", f"#STAGER stage_in {url}/ds in", "sleep 300")
    job = slurm.sbatch(script)
    slurm.wait_job(job, until=lambda r: r["JobState"] == "RUNNING", timeout=60)
    staged = {f.path for f in admin.walk(f"/jobs/{job}/in")}
    assert {f"/jobs/{job}/in/{k}" for k in digests} <= staged   # in before it ran
    assert slurm.command(["scancel", str(job)], as_user=True).returncode == 0
    assert slurm.wait_job(job)["JobState"] == "CANCELLED"
    wait_gone(admin, f"/jobs/{job}")


# -- confinement: two users, one of them in team-a ----------------------------------------
PROBE = '''
import json, os
from stager import Client
from stager.errors import Forbidden

job, job_dir = os.environ["SLURM_JOB_ID"], os.environ["STAGER_JOB_DIR"]


def attempt(work):
    try:
        work()
        return "allowed"
    except Forbidden:
        return "forbidden"


out = {}
with Client() as c, Client(token=os.environ["STAGER_READ_TOKEN"]) as ro:
    for name in ("keep", "scratch"):
        out[name] = len(list(c.walk(f"/datasets/team-a/{name}-{job}")))
    out["in"] = len(list(c.walk(f"{job_dir}/in")))
    out["other team cat"] = attempt(lambda: c.cat("/datasets/team-b/secret.txt"))
    out["other team rm"] = attempt(lambda: c.rm("/datasets/team-b", recursive=True))
    out["team-a, not named"] = attempt(lambda: c.cat("/datasets/team-a/base.txt"))
    out["reference, job token"] = attempt(lambda: c.cat("/datasets/reference/ref.txt"))
    out["reference, read token"] = ro.cat("/datasets/reference/ref.txt").decode()
    out["reference write"] = attempt(lambda: ro.pipe("/datasets/reference/new", b"x"))
    c.pipe(f"{job_dir}/out/probe.json", json.dumps(out).encode())
'''


@pytest.fixture(scope="module")
def teams(admin: Client) -> None:
    """Data of two teams and a reference set, written with the admin token."""
    admin.pipe("/datasets/team-a/base.txt", b"team a's own")
    admin.pipe("/datasets/team-b/secret.txt", b"team b's secret")
    admin.pipe("/datasets/reference/ref.txt", b"reference data")


@pytest.fixture
def audit() -> Iterator[list[str]]:
    """The metadata server's audit lines (its logger, in this process) while a test runs."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep()
    logging.getLogger("stager.audit").addHandler(handler)
    yield lines
    logging.getLogger("stager.audit").removeHandler(handler)


def rejected(slurm: SlurmCluster, script: Path, user: str | None = None) -> str:
    """sbatch's error for ``script`` (the job must be refused)."""
    with pytest.raises(SlurmError) as err:
        slurm.sbatch(script, user=user)
    return str(err.value)


def test_another_users_job_naming_a_teams_path_is_rejected_at_sbatch(
        slurm: SlurmCluster, persistent: ThreadCluster, admin: Client, teams: None) -> None:
    script = job_script(slurm, "thief", "#STAGER stage_out /datasets/team-a file:///tmp/loot",
                        "true")
    message = rejected(slurm, script, user=OTHER_USER)
    assert ("line 4: stage_out /datasets/team-a file:///tmp/loot: /datasets/team-a is "
            f"outside the job's directory /jobs/0 and slurm.toml's [grants] give user "
            f"{OTHER_USER}") in message, message
    assert admin.cat("/datasets/team-a/base.txt") == b"team a's own"


@pytest.mark.parametrize(("directive", "says"), [
    ("#STAGER stage_in {url}/ds /elsewhere/ds",
     "/elsewhere/ds is outside the job's directory /jobs/0 and slurm.toml's [grants] give "
     f"user stagerbb (groups stagerbb, {TEAM_A}) nothing there"),
    ("#STAGER stage_in {url}/ds /jobs/1/in", "/jobs/1/in is outside the job's directory"),
    ("#STAGER stage_in {url}/ds /datasets/reference/mine",
     f"/datasets/reference/mine is granted read-only to user stagerbb (groups stagerbb, "
     f"{TEAM_A}) (ro:/datasets/reference); stage_in writes there"),
    ("#STAGER stage_in {url}/ds /datasets/team-a --scratch",
     "--scratch names the granted prefix /datasets/team-a itself"),
])
def test_a_path_beyond_the_job_dir_and_its_grants_rejects_the_job_at_sbatch(
        slurm: SlurmCluster, persistent: ThreadCluster, source: tuple[str, dict[str, str]],
        directive: str, says: str) -> None:
    url, _ = source
    message = rejected(slurm, job_script(slurm, "far", directive.format(url=url), "true"))
    assert "line 4: stage_in" in message and says in message, message


def test_a_team_members_job_reaches_its_grants_and_nothing_else(
        slurm: SlurmCluster, persistent: ThreadCluster, admin: Client, teams: None,
        source: tuple[str, dict[str, str]], audit: list[str]) -> None:
    """stage_in into team-a (kept) and a --scratch copy there (removed at teardown),
    stage_out from the read-only reference set; inside the job its token reads what its
    directives name and nothing of team-b; staging used per-job tokens, all revoked."""
    url, digests = source
    results = slurm.work / "team-results"
    results.mkdir()
    os.chown(results, slurm.uid, slurm.gid)
    (slurm.work / "probe.py").write_text(PROBE)
    script = job_script(slurm, "team", f"""
#STAGER stage_in {url}/ds /datasets/team-a/keep-$SLURM_JOB_ID --include '*.bin'
#STAGER stage_in {url}/ds /datasets/team-a/scratch-$SLURM_JOB_ID --include '*.bin' --scratch
#STAGER stage_in {url}/ds in --include '*.bin'
#STAGER stage_out /datasets/reference file://{results}/reference
#STAGER stage_out out file://{results}/out
""", f"srun -n 1 {sys.executable} {slurm.work}/probe.py")
    job = slurm.sbatch(script)
    record = slurm.wait_job(job, timeout=180)
    output = slurm.work / f"team-{job}.out"
    assert record["JobState"] == "COMPLETED", (record, output.read_text() if output.exists()
                                               else "", slurm.log_tails())
    probe = results / "out" / "probe.json"
    deadline = time.monotonic() + 60
    while not probe.exists():
        assert time.monotonic() < deadline, (slurm.job(job), slurm.log_tails())
        time.sleep(0.3)
    seen = json.loads(probe.read_text())
    assert seen == {"keep": len(digests), "scratch": len(digests), "in": len(digests),
                    "other team cat": "forbidden", "other team rm": "forbidden",
                    "team-a, not named": "forbidden", "reference, job token": "forbidden",
                    "reference, read token": "reference data",
                    "reference write": "forbidden"}, seen
    # teardown: the job's directory and the scratch copy go; team-a's data stays
    wait_gone(admin, f"/jobs/{job}")
    wait_gone(admin, f"/datasets/team-a/scratch-{job}")
    assert len(list(admin.walk(f"/datasets/team-a/keep-{job}"))) == len(digests)
    assert admin.cat("/datasets/team-a/base.txt") == b"team a's own"
    assert admin.cat("/datasets/team-b/secret.txt") == b"team b's secret"
    assert (results / "reference" / "ref.txt").read_bytes() == b"reference data"

    # every token the hooks used was minted for this job, on exactly its paths, and is
    # revoked once teardown is done (it revokes last)
    def minted() -> dict[str, object]:
        return {t.name: t for t in admin.list_tokens() if t.name.startswith(f"slurm-job-{job}")}
    deadline = time.monotonic() + 30
    while not all(t.revoked for t in minted().values()):
        assert time.monotonic() < deadline, minted()
        time.sleep(0.3)
    tokens = minted()
    keep, scratch = f"/datasets/team-a/keep-{job}", f"/datasets/team-a/scratch-{job}"
    assert {n: (t.scopes, set(t.prefixes)) for n, t in tokens.items()} == {  # type: ignore[attr-defined]
        f"slurm-job-{job}": (("read", "write"), {f"/jobs/{job}", keep, scratch}),
        f"slurm-job-{job}-read": (("read",), {"/datasets/reference"}),
        f"slurm-job-{job}-stage-in": (("read", "write"), {f"/jobs/{job}", keep, scratch}),
        f"slurm-job-{job}-stage-out": (("read",), {"/datasets/reference", f"/jobs/{job}/out"}),
        f"slurm-job-{job}-teardown": (("read", "write"), {f"/jobs/{job}", scratch}),
    }
    # and the metadata server saw the staging writes come from the stage-in token
    staged = [line for line in audit if f"path={keep}" in line and "status=2" in line]
    assert staged and all(f"name='slurm-job-{job}-stage-in'" in line for line in staged), audit
    mine = re.compile(rf"path=\S*(/jobs/{job}|{keep}|{scratch})(/|,| |$)")
    ours = [line for line in audit if mine.search(line)]
    assert ours and all(f"name='slurm-job-{job}" in line for line in ours), ours
