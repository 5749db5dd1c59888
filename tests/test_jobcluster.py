"""``stager job up/down``: a per-job cluster on emulated nodes, as srun would start it.

Each node is a network namespace with its own address (stager.testing.jobnodes);
one ``stager job up`` per node, with the Slurm variables ``srun`` sets.  The
real-Slurm tests run the same commands through ``srun``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stager import Client
from stager.config import load_config
from stager.deploy.jobcluster import default_root
from stager.deploy.slurmenv import expand_hostlist, job_from_env
from stager.errors import BadRequest
from stager.stage import StageOptions
from stager.testing.jobnodes import EmulatedJob
from stager.testing.netns import netns_unavailable

# emulated nodes in network namespaces: not in make check.  Run beside nothing else that
# starts per-job clusters or nodes (the Slurm and network namespace modules, by their
# group; the node benchmarks of the quick run, by the nodes lock: tests/conftest.py): in
# parallel with them, CI saw a job's servers SIGTERMed while starting, and a real Slurm
# job's `job up` fail (cause not found; see the closing note).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]

WHY = netns_unavailable()
needs_netns = pytest.mark.skipif(WHY is not None, reason=f"emulated nodes: {WHY}")
REPO = Path(__file__).resolve().parent.parent
EPILOG = REPO / "deploy" / "slurm" / "epilog.sh"


# -- what a node learns from Slurm's environment ------------------------------------------
@pytest.mark.parametrize(("hostlist", "hosts"), [
    ("n1", ["n1"]),
    ("n[0-2]", ["n0", "n1", "n2"]),
    ("gpu[07-09,11],login1", ["gpu07", "gpu08", "gpu09", "gpu11", "login1"]),
    ("r[1-2]n[8-9]", ["r1n8", "r1n9", "r2n8", "r2n9"]),
    ("a[098-101]-ib", ["a098-ib", "a099-ib", "a100-ib", "a101-ib"]),
])
def test_hostlists_expand_like_scontrol(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts


def test_bad_hostlist_range_is_refused() -> None:
    with pytest.raises(BadRequest):
        expand_hostlist("n[5-2]")


def test_the_job_from_slurm_variables(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "77", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "c[10-12]",
           "SLURMD_NODENAME": "c12", "SLURM_SUBMIT_DIR": str(tmp_path)}
    job = job_from_env({**env, "SLURM_STEP_ID": "3"})
    assert (job.job_id, job.node_id, job.nodes, job.node, job.first, job.step) == \
        ("77", 2, ("c10", "c11", "c12"), "c12", False, "3")
    assert job.job_dir == tmp_path / ".stager-job-77"
    assert job_from_env({**env, "STAGER_JOB_DIR": "/shared/j"}).job_dir == Path("/shared/j")
    # no SLURM_NODEID (a plain `ssh node stager job up`): the position in the node list
    del env["SLURM_NODEID"]
    assert job_from_env({**env, "SLURMD_NODENAME": "c10"}).first
    with pytest.raises(BadRequest, match="SLURM_JOB_ID"):
        job_from_env({})


def test_the_default_root_carries_the_job_and_the_node(tmp_path: Path) -> None:
    """``/tmp`` may be shared by the nodes (and is by a node's jobs): each job and node
    gets a root of its own."""
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "c[10-11]",
           "SLURM_SUBMIT_DIR": str(tmp_path)}
    roots = {default_root(job_from_env({**env, "SLURM_JOB_ID": j, "SLURMD_NODENAME": n}),
                          {"TMPDIR": "/scratch/t"})
             for j in ("77", "78") for n in ("c10", "c11")}
    assert roots == {Path(f"/scratch/t/stager-job-{j}.{n}") for j in ("77", "78")
                     for n in ("c10", "c11")}
    job = job_from_env({**env, "SLURMD_NODENAME": "c11"})
    assert default_root(job, {}) == Path("/tmp/stager-job-77.c11")


def test_stage_shares_must_be_in_range() -> None:
    assert StageOptions(share=(2, 3)).share == (2, 3)
    with pytest.raises(BadRequest):
        StageOptions(share=(3, 3))


# -- a whole job on three emulated nodes ---------------------------------------------------
def _dataset(root: Path, files: int = 30) -> dict[str, bytes]:
    """A shared-tier directory: files of assorted sizes, one above a chunk."""
    data = {}
    for i in range(files):
        rel = f"part{i % 3}/sample{i:03d}.bin"
        data[rel] = os.urandom(1000 * i + 17 if i != 7 else (5 << 20) + 3)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data[rel])
    return data


def _client(job: EmulatedJob) -> Client:
    cluster = job.cluster()
    token = {"STAGER_TOKEN_FILE": cluster["token_file"]} if cluster["auth"] else {}
    config = load_config(env=token)
    return Client(cluster["meta"]["url"], config=config)


@needs_netns
def test_job_up_on_three_nodes_stages_serves_and_goes_down_clean(tmp_path: Path) -> None:
    src = tmp_path / "shared" / "dataset"
    data = _dataset(src)
    with EmulatedJob(tmp_path / "job", nodes=3, mode="netns") as job:
        outs = job.step(["job", "up", "--stage-in", str(src), "/ds", "--chunk-size", "1MiB"])
        cluster = job.cluster()
        # node 0 prints the lines later steps evaluate; they name the job's cluster
        assert f"export STAGER_META_URL={cluster['meta']['url']}" in outs[0].stdout
        assert cluster["nodes"] == ["node0", "node1", "node2"] and cluster["auth"]
        assert (job.job_dir / "admin.token").stat().st_mode & 0o777 == 0o600
        # every server outlived its `job up` (the srun step) and serves at its node's address
        assert len(job.processes()) == 4           # 1 metadata + 3 data servers
        with _client(job) as client:
            by_node = {t.node: t.url for t in client.targets() if t.up}
            assert sorted(by_node) == ["node0", "node1", "node2"]
            for i in range(3):
                assert by_node[f"node{i}"].startswith(f"http://{job.address(i)}:")
            assert cluster["meta"]["url"].startswith(f"http://{job.address(0)}:")
            # the copy ran from every node: each staged about a third of the files
            shares = [int(s.split("staged ")[1].split()[0]) for o in outs
                      for s in o.stderr.splitlines() if " share " in s]
            assert sorted(shares) == [10, 10, 10]
            assert cluster["stage_in"][0]["files"] == 30
            assert cluster["stage_in"][0]["recopied"] == 0
            for rel, body in data.items():
                assert hashlib.sha256(client.cat(f"/ds/{rel}")).digest() == \
                    hashlib.sha256(body).digest(), rel
            assert client.get_manifest("/ds") is not None
        # a later step on node 2 finds the cluster through `stager job env`
        env = job.run(2, ["job", "env"])
        assert env.returncode == 0 and cluster["meta"]["url"] in env.stdout
        # the chunks are on the nodes' local roots
        assert all(any(job.node_root(i).rglob("*.chunk")) or
                   any(p.is_file() for p in (job.node_root(i) / "data").rglob("*"))
                   for i in range(3))
        job.step(["job", "down"])
        assert job.leftovers() == ([], [])


@needs_netns
def test_a_killed_job_is_cleaned_by_the_epilog(tmp_path: Path) -> None:
    with EmulatedJob(tmp_path / "job", nodes=3, mode="netns", job_id="43") as job:
        job.step(["job", "up", "--insecure"])
        pids = job.processes()
        assert len(pids) == 4
        # the job is cancelled: every process of it is killed at once, no `job down`
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        _gone(job)
        assert any(job.node_root(i).exists() for i in range(3))
        for i in range(3):
            done = job.epilog(i, EPILOG)
            assert done.returncode == 0, done.stderr
        assert job.leftovers() == ([], [])


@needs_netns
def test_the_epilog_stops_live_servers_too(tmp_path: Path) -> None:
    with EmulatedJob(tmp_path / "job", nodes=3, mode="netns", job_id="44") as job:
        job.step(["job", "up"])
        assert len(job.processes()) == 4
        for i in (2, 1, 0):         # node 0 last: it owns the job directory
            assert job.epilog(i, EPILOG).returncode == 0
        assert job.leftovers() == ([], [])


@needs_netns
def test_a_foreground_job_up_stops_its_node_on_sigterm(tmp_path: Path) -> None:
    """``srun … stager job up --foreground &``: the step holds the servers; Slurm's
    SIGTERM at the step's end stops them and empties the node's root."""
    with EmulatedJob(tmp_path / "job", nodes=3, mode="netns", job_id="45") as job:
        steps = [job.popen(i, ["job", "up", "--foreground", "--quiet"]) for i in range(3)]
        for p in steps:     # each says so once it is up (node 0 prints its env first)
            assert p.stdout is not None
            while not (line := p.stdout.readline()).startswith("stager job up:"):
                assert line, f"job up exited with {p.wait()}: {p.communicate()[1]}"
        assert len(job.processes()) == 4
        with _client(job) as client:
            assert len([t for t in client.targets() if t.up]) == 3
        assert all(p.poll() is None for p in steps)     # the steps hold the cluster
        for p in steps:
            p.send_signal(signal.SIGTERM)
        for p in steps:
            p.communicate(timeout=60)
        assert [p.returncode for p in steps] == [0, 0, 0]
        assert job.leftovers() == ([], [])


@pytest.mark.parametrize("cleanup", ["job down", "epilog"])
def test_a_node_that_fails_stops_the_others_and_its_logs_stay(
        tmp_path: Path, cleanup: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage-in from a missing source: every node fails, none leaves a server; the
    job's end (``job down`` on node 0, or the epilog) removes the tokens but keeps
    ``failed`` and the servers' logs, the user's only account of why."""
    epilog_log = tmp_path / "epilog.log"
    monkeypatch.setenv("STAGER_EPILOG_LOG", str(epilog_log))
    with EmulatedJob(tmp_path / "job", nodes=2, mode="loopback", job_id="46") as job:
        with pytest.raises(RuntimeError) as failed:
            job.step(["job", "up", "--stage-in", str(tmp_path / "missing"), "/ds",
                      "--timeout", "60"])
        assert "missing" in str(failed.value)
        assert f"the servers' logs: {job.job_dir / 'logs'}/" in str(failed.value)
        assert job.processes() == []
        assert not any(job.node_root(i).exists() for i in range(2))
        if cleanup == "job down":
            down = job.run(0, ["job", "down"])
            assert down.returncode == 0 and "kept " in down.stderr, down.stderr
            assert job.run(1, ["job", "down"]).returncode == 0
        else:
            for i in (1, 0):
                assert job.epilog(i, EPILOG).returncode == 0
            said = epilog_log.read_text()
            assert "stager-epilog: job 46 on node0: " in said and "kept " in said, said
        # the tokens are gone; the failure and both nodes' server logs are there
        assert sorted(p.name for p in job.job_dir.iterdir()) == ["failed", "logs"]
        assert "missing" in (job.job_dir / "failed").read_text()
        assert {"node0-meta.log", "node0-data.log", "node1-data.log"} <= \
            {p.name for p in (job.job_dir / "logs").iterdir()}
        shutil.rmtree(job.job_dir)      # the user, having read them
        assert job.leftovers() == ([], [])


def test_the_epilog_logs_a_failed_job_down(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The epilog's output goes nowhere and ``logger`` drops its line where no syslog
    listens: a failure also goes to ``$STAGER_EPILOG_LOG``, and the epilog exits 0."""
    epilog_log = tmp_path / "epilog.log"
    monkeypatch.setenv("STAGER_EPILOG_LOG", str(epilog_log))
    with EmulatedJob(tmp_path / "job", nodes=1, mode="loopback", job_id="47") as job:
        (job.run_dir / "stager-job-47.node0.json").write_text("{not json")
        done = job.epilog(0, EPILOG)
        assert done.returncode == 0, done.stderr
        said = epilog_log.read_text()
        assert "stager-epilog: job 47 on node0: job down failed: stager: error: " in said
        (job.run_dir / "stager-job-47.node0.json").unlink()


def _loopback_up(job: EmulatedJob, i: int, *args: str, step: int = 0
                 ) -> subprocess.Popen[str]:
    """``job up`` on node ``i`` as step ``step``'s ``srun`` starts it, with only ``args``
    (no --root)."""
    return subprocess.Popen([sys.executable, "-m", "stager", "job", "up", "--host",
                             "127.0.0.1", "--insecure", "--quiet", *args],
                            env={**job.env(i), "SLURM_STEP_ID": str(step)}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _succeeds(proc: subprocess.Popen[str]) -> None:
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err


def test_nodes_sharing_a_tmp_get_roots_of_their_own(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The default root carries the job and the node: two nodes with one ``$TMPDIR``
    (before: one root, one target id, ``targets … not up in time``)."""
    tmp = tmp_path / "shared-tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    with EmulatedJob(tmp_path / "job", nodes=2, mode="loopback", job_id="48") as job:
        ups = [_loopback_up(job, i, "--timeout", "40") for i in range(2)]
        outs = [p.communicate(timeout=90) for p in ups]
        assert [p.returncode for p in ups] == [0, 0], outs
        assert sorted(p.name for p in tmp.iterdir()) == ["stager-job-48.node0",
                                                         "stager-job-48.node1"]
        with _client(job) as client:
            assert sorted(t.node for t in client.targets() if t.up) == ["node0", "node1"]
        job.step(["job", "down"])
        assert list(tmp.iterdir()) == [] and job.leftovers() == ([], [])


def test_a_root_live_servers_hold_is_refused_at_once(tmp_path: Path) -> None:
    """``ROOT/.lock`` is held by the servers ``job up`` started: another job up on that
    root, of another job or of the same, is refused before it touches anything; once
    the servers are gone the root is free again."""
    shared = tmp_path / "one-root"
    with EmulatedJob(tmp_path / "a", nodes=1, mode="loopback", job_id="60") as first, \
            EmulatedJob(tmp_path / "b", nodes=1, mode="loopback", job_id="61") as second:
        up = _loopback_up(first, 0, "--root", str(shared))
        _succeeds(up)
        before = sorted(str(p) for p in shared.rglob("*"))
        for job in (second, first):
            started = time.monotonic()
            again = _loopback_up(job, 0, "--root", str(shared), "--timeout", "60", step=1)
            _, err = again.communicate(timeout=90)
            assert again.returncode == 1 and time.monotonic() - started < 30, err
            assert f"{shared} is in use by live stager servers (job 60 node node0" in err
        # the first job's cluster is untouched: its servers, its files, its targets
        assert len(first.processes()) == 2 and second.processes() == []
        assert sorted(str(p) for p in shared.rglob("*")) == before
        with _client(first) as client:
            assert [t.node for t in client.targets() if t.up] == ["node0"]
        first.run(0, ["job", "down"])
        assert not shared.exists()
        # a root whose servers were killed (-9, no job down) is free again
        up = _loopback_up(second, 0, "--root", str(shared), step=2)
        _succeeds(up)
        for pid in second.processes():
            os.kill(pid, signal.SIGKILL)
        _gone(second)
        up = _loopback_up(second, 0, "--root", str(shared), "--job-dir",
                          str(tmp_path / "b" / "retry"), step=3)
        _succeeds(up)


def test_a_root_shared_by_the_nodes_fails_the_job_at_once(tmp_path: Path) -> None:
    """deploy/README.md's old ``--root "${TMPDIR:-/tmp}/stager"`` on nodes sharing one
    ``/tmp``: one node gets the root, the others are refused, and the whole step fails
    in seconds (before: after --timeout, ``targets … not up in time``)."""
    shared = tmp_path / "tmp" / "stager"
    with EmulatedJob(tmp_path / "job", nodes=3, mode="loopback", job_id="62") as job:
        started = time.monotonic()
        ups = [_loopback_up(job, i, "--root", str(shared), "--timeout", "90")
               for i in range(3)]
        errs = [p.communicate(timeout=150)[1] for p in ups]
        assert [p.returncode for p in ups] == [1, 1, 1], errs
        assert time.monotonic() - started < 45, errs
        # each node was refused, or got the root and stopped for a refused one's sake
        # (the root is free again once it stopped: a late node may get it after it)
        refused = [e.startswith(f"stager job up: node node{i}: {shared} is in use by live "
                                "stager servers (job 62 node node")
                   for i, e in enumerate(errs)]
        assert any(refused), errs
        for e, was_refused in zip(errs, refused, strict=True):
            assert was_refused or "another node failed: step 0: node node" in e, errs
            assert f"{shared} is in use" in e, errs
        assert job.processes() == []


def _gone(job: EmulatedJob, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while job.processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.processes() == []


def test_a_server_bound_to_every_address_advertises_one_others_reach(tmp_path: Path) -> None:
    """``--host 0.0.0.0`` without ``--advertise-url`` used to advertise 127.0.0.1, which
    a data server then registered with a metadata server on another machine."""
    import json
    import subprocess
    import sys
    import urllib.request

    from stager.web.server import machine_address

    here = machine_address()
    proc = subprocess.Popen([sys.executable, "-m", "stager", "meta", "--root",
                             str(tmp_path / "m"), "--host", "0.0.0.0", "--port", "0",
                             "--insecure"], stderr=subprocess.DEVNULL)
    try:
        ready = tmp_path / "m" / "server.json"
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        url = json.loads(ready.read_text())["url"]
        assert url.split("//")[1].rsplit(":", 1)[0] == here
        with urllib.request.urlopen(f"{url}/v1/health", timeout=10) as resp:
            assert resp.status == 200
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.skipif(os.geteuid() != 0, reason="the epilog's case: root acting for a user")
def test_job_down_as_root_removes_only_what_the_user_could(tmp_path: Path) -> None:
    """Run by the epilog as root for the job's user, removal drops to that user: a
    root-owned file that the user's directory holds stays (and says so)."""
    import json
    import shutil
    import tempfile

    from stager.deploy.jobprocs import NodeRecord, record_path, stop_node

    nobody = 65534
    base = Path(tempfile.mkdtemp(prefix="stager-jobdown-", dir="/tmp"))
    try:
        base.chmod(0o1777)             # like /tmp: a user removes what is theirs
        for job_id, planted in (("50", False), ("51", True)):
            root = base / f"root{job_id}"
            (root / "data").mkdir(parents=True)
            (root / "data" / "chunk").write_bytes(b"x")
            for p in (root, root / "data", root / "data" / "chunk"):
                os.chown(p, nobody, nobody)
            if planted:                 # something of root's inside the user's tree
                (root / "data" / "roots").mkdir()
                (root / "data" / "roots" / "keep").write_text("root's")
            record = record_path(base, job_id, "n1")
            NodeRecord(job_id, "n1", str(root), str(base / "jobdir"), False).save(record)
            os.chown(record, nobody, nobody)
            if not planted:
                report = stop_node(job_id, "n1", base, uid=nobody)
                assert report.removed == [str(root)] and not root.exists()
                assert not record.exists()
            else:
                with pytest.raises(PermissionError):
                    stop_node(job_id, "n1", base, uid=nobody)
                assert (root / "data" / "roots" / "keep").read_text() == "root's"
        # a record that is not the job user's is refused outright
        other = record_path(base, "52", "n1")
        other.write_text(json.dumps(NodeRecord("52", "n1", "/etc", "/etc", True).__dict__))
        with pytest.raises(BadRequest):
            stop_node("52", "n1", base, uid=nobody)
        assert Path("/etc/passwd").exists()
    finally:
        shutil.rmtree(base)


def test_job_up_attach_warms_a_cached_view_instead_of_a_copy(tmp_path: Path) -> None:
    """``--attach SRC DST`` (issue 28): node 0 attaches DST to SRC and warms it before the
    cluster is ready; every byte then reads from the cache, exact."""
    src = tmp_path / "shared" / "dataset"
    data = _dataset(src, files=6)
    with EmulatedJob(tmp_path / "job", nodes=2, mode="loopback", job_id="2802") as job:
        job.step(["job", "up", "--attach", f"file://{src}", "/view", "--chunk-size", "1MiB"])
        try:
            [attached] = job.cluster()["attach"]
            total = sum(len(b) for b in data.values())
            assert attached == {"source": f"file://{src}", "destination": "/view",
                                "files": 6, "bytes": total, "fetched": total}
            with _client(job) as client:
                [view] = client.attachments()
                assert (view.path, view.cached_bytes, view.bytes) == ("/view", total, total)
                for rel, body in data.items():
                    assert client.cat(f"/view/{rel}") == body, rel
                [view] = client.attachments()
                # warm counts no hit or miss; the reads after it are hits all
                assert (view.cached_bytes, view.misses, view.hits) == (total, 0, 6), view
        finally:
            job.step(["job", "down", "--quiet"])
        assert job.leftovers() == ([], [])
