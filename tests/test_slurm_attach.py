"""``#STAGER attach SRC DST`` and ``#STAGER capacity=SIZE`` (issue 28): the directives,
their refusals, where a job may attach (the grants), and the hooks that attach, warm,
set the quota and detach, against a real cluster (tests/slurm/ runs them on a real
Slurm)."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stager import Client
from stager.stage.directives import Directive, DirectiveError, parse_directives
from stager.stage.grants import Access, Grants, NotGranted, Owner, confine
from stager.testing import ThreadCluster
from stager.testing.httpserver import HttpServer


def parsed(*lines: str, job: int = 5) -> list[Directive]:
    return parse_directives("#!/bin/sh\n#SBATCH -N 1\n"
                            + "".join(f"#STAGER {x}\n" for x in lines), job_id=job)


def test_attach_and_capacity_are_parsed_beside_the_staging_directives() -> None:
    assert parsed("attach s3://bucket/laion laion --include '*.tar' --refresh 3600",
                  "attach https://h/ds /datasets/team-a/ds-$SLURM_JOB_ID --exclude '*.tmp'",
                  "capacity=2GiB",
                  "stage_in https://h/d in") == [
        Directive("attach", "s3://bucket/laion", "/jobs/5/laion", 3, ("*.tar",),
                  refresh=3600.0),
        Directive("attach", "https://h/ds", "/datasets/team-a/ds-5", 4, exclude=("*.tmp",)),
        Directive("capacity", "", "/jobs/5", 5, capacity=2 << 30),
        Directive("stage_in", "https://h/d", "/jobs/5/in", 6),
    ]
    # Slurm's own form for a burst buffer's size names a pool too: stager has one
    assert parsed("pool=stager capacity=10G")[0].capacity == 10 << 30
    attach, capacity = parsed("attach s3://b/x x", "capacity=1M")
    assert (attach.stager_path, attach.writes) == ("/jobs/5/x", True)
    assert (capacity.stager_path, capacity.writes) == ("/jobs/5", False)


@pytest.mark.parametrize(("line", "says"), [
    ("#STAGER attach https://h/d", "required: dst"),
    ("#STAGER attach https://h/d in --scratch", "attach takes no --scratch: attach SRC DST "
                                                "[--include GLOB] [--exclude GLOB] "
                                                "[--refresh SECONDS]"),
    ("#STAGER attach https://h/d in extra", "unexpected 'extra'"),
    ("#STAGER attach /local/dir in", "attach's source '/local/dir' must be a URL outside "
                                     "stager"),
    ("#STAGER attach file:///etc in", "the stager servers read an attached source with "
                                      "their own rights, so file:// is refused"),
    ("#STAGER attach memory://x/y in", "so memory:// is refused"),
    ("#STAGER attach ftp://h/d in", "must be a URL of one of"),
    ("#STAGER attach s3:// in", "naming a directory below its root"),
    ("#STAGER attach https://h/d in --refresh 0.5", "'refresh' must be at least 1.0 seconds"),
    ("#STAGER attach https://h/d in --refresh soon", "invalid float value: 'soon'"),
    ("#STAGER attach https://h/d ../../etc", "invalid path segment '..'"),
    ("#STAGER attach https://h/d stager://h:1/p", "name the stager side by its path"),
    ("#STAGER attach https://h/$HOME in", "only $SLURM_JOB_ID is expanded"),
    ("#STAGER stage_in https://h/d in --refresh 60", "stage_in takes no --refresh"),
    ("#STAGER stage_out out file:///r --refresh 60", "stage_out takes no "
                                                     "--include/--exclude/--scratch/--refresh"),
    ("#STAGER capacity=0", "capacity=0: a size above 0"),
    ("#STAGER capacity=lots", "capacity=lots: a size above 0"),
    ("#STAGER capacity=1G spare", "unexpected 'spare': capacity=SIZE [pool=NAME]"),
    ("#STAGER pool=stager", "pool=NAME without capacity=SIZE"),
])
def test_a_malformed_attach_or_capacity_names_its_line(line: str, says: str) -> None:
    with pytest.raises(DirectiveError) as err:
        parse_directives(f"#!/bin/sh\n#SBATCH -N 1\n{line}\n")
    assert str(err.value).startswith(f"line 3: {line.split(' ')[0]}"), err.value
    assert says in str(err.value), err.value


def test_a_job_has_one_capacity() -> None:
    with pytest.raises(DirectiveError, match="line 4: #STAGER capacity=2G: a second "
                                             "capacity=: a job has one"):
        parsed("capacity=1G", "capacity=2G")


GRANTS = Grants.parse({"@team-a": ["/datasets/team-a", "ro:/datasets/ref"]}, "/jobs")
ALICE = Owner("alice", frozenset({"team-a"}))


def reach(*lines: str) -> list[Access]:
    return confine(parsed(*lines), "/jobs/5", GRANTS.of(ALICE), ALICE)


def test_an_attach_reaches_where_a_stage_in_may_write_and_nowhere_else() -> None:
    assert reach("attach https://h/d in", "capacity=1G",
                 "attach https://h/d /datasets/team-a/view") == [
        Access("/jobs/5", True), Access("/datasets/team-a/view", True)]
    for line, says in (
            ("attach https://h/d /datasets/ref/view",
             "/datasets/ref/view is granted read-only to user alice (groups team-a) "
             "(ro:/datasets/ref); attach writes there"),
            ("attach https://h/d /jobs/6/view", "/jobs/6/view is outside the job's directory "
                                                "/jobs/5"),
            ("attach https://h/d /elsewhere", "give user alice (groups team-a) nothing there")):
        with pytest.raises(NotGranted) as err:
            reach("stage_in https://h/d in", line)
        assert str(err.value).startswith(f"line 4: {line}"), err.value
        assert says in str(err.value), err.value


# -- the hooks, as processes, against a real cluster with auth ------------------------------
KiB = 1024
NOBODY = pwd.getpwnam("nobody")      # a job's owner: data_in drops root for it


def run_hook(settings: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stager", "slurm", args[0], "--config",
                           str(settings), *args[1:]], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[ThreadCluster, Path, str]]:
    """A cluster with auth, the hooks' settings (its admin token, root's), and a dataset
    over HTTP: the cluster, the settings file, the dataset's URL."""
    data = tmp_path / "www" / "ds"
    data.mkdir(parents=True)
    for name, kib in (("a.bin", 40), ("b.bin", 80), ("notes.txt", 1)):
        (data / name).write_bytes(os.urandom(kib * KiB))
    with ThreadCluster(tmp_path / "c", data_servers=2, auth=True) as cluster, \
            HttpServer(tmp_path / "www") as http:
        admin = tmp_path / "admin.token"
        admin.write_text(cluster.admin_token)
        admin.chmod(0o600)
        settings = tmp_path / "slurm.toml"
        settings.write_text(f'meta_url = "{cluster.meta_url}"\njobs_dir = "/bbjobs"\n'
                            f'state_dir = "{tmp_path / "state"}"\ntoken_file = "{admin}"\n'
                            'job_token_ttl = 3600\n')
        yield cluster, settings, f"{http.url}/ds"


@pytest.mark.slow
def test_attach_warms_before_the_job_and_teardown_detaches_with_tokens_of_its_own(
        world: tuple[ThreadCluster, Path, str], tmp_path: Path) -> None:
    """setup sets the job directory's quota (capacity=); data_in attaches and warms with
    an admin token on exactly the attached directory; the job reads it with its own
    token; teardown detaches it, removes the job's directory and revokes every token."""
    cluster, settings, url = world
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\n#STAGER attach {url} view --include '*.bin'\n"
                      "#STAGER capacity=1MiB\n")
    done = run_hook(settings, "job_process", str(script))
    assert (done.returncode, done.stdout) == (0, "2 stager directive(s)\n")
    owner = (str(NOBODY.pw_uid), str(NOBODY.pw_gid))
    done = run_hook(settings, "setup", "11", *owner, "stager", "0", str(script))
    assert done.returncode == 0, done.stdout
    assert done.stdout.rstrip().endswith("; quota of /bbjobs/11: 1048576 bytes"), done.stdout
    done = run_hook(settings, "data_in", "11", str(script))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == (f"{url} -> /bbjobs/11/view: attached, 2 files, {120 * KiB} bytes, "
                           f"{120 * KiB} bytes fetched\n"), done.stdout
    env = tmp_path / "env"
    assert run_hook(settings, "paths", "11", str(script), str(env)).returncode == 0
    token = dict(line.split("=", 1) for line in env.read_text().splitlines())["STAGER_TOKEN"]

    with Client(cluster.meta_url, token=cluster.admin_token) as admin:
        [view] = [a for a in admin.attachments() if a.path == "/bbjobs/11/view"]
        assert (view.source, view.files, view.cached_bytes) == (url, 2, 120 * KiB)  # warm
        [quota] = [q for q in admin.quotas() if q.path == "/bbjobs/11"]
        assert quota.bytes == 1 << 20
        with Client(cluster.meta_url, token=token) as job:
            for name in ("a.bin", "b.bin"):
                assert job.cat(f"/bbjobs/11/view/{name}") == \
                    (tmp_path / "www" / "ds" / name).read_bytes()
            assert not job.exists("/bbjobs/11/view/notes.txt")        # --include
        done = run_hook(settings, "teardown", "11", str(script), "false")
        assert done.returncode == 0, done.stdout
        assert done.stdout.startswith("detached /bbjobs/11/view (2 files, "), done.stdout
        assert "removed /bbjobs/11" in done.stdout and "token(s) revoked" in done.stdout
        assert "/bbjobs/11/view" not in {a.path for a in admin.attachments()}
        assert not admin.exists("/bbjobs/11")
        assert "/bbjobs/11" not in {q.path for q in admin.quotas()}
        minted = {t.name: t for t in admin.list_tokens() if t.name.startswith("slurm-job-11")}
    assert {n: (t.scopes, t.prefixes) for n, t in minted.items()} == {
        "slurm-job-11": (("read", "write"), ("/bbjobs/11",)),
        "slurm-job-11-capacity": (("admin",), ("/bbjobs/11",)),
        "slurm-job-11-attach": (("admin",), ("/bbjobs/11/view",)),
        "slurm-job-11-stage-in": (("read", "write"), ("/bbjobs/11",)),
        "slurm-job-11-detach": (("admin",), ("/bbjobs/11/view",)),
        "slurm-job-11-teardown": (("read", "write"), ("/bbjobs/11",)),
    }
    assert all(t.revoked for t in minted.values())


@pytest.mark.slow
def test_an_attach_whose_source_fails_holds_the_job_naming_the_line(
        world: tuple[ThreadCluster, Path, str], tmp_path: Path) -> None:
    cluster, settings, url = world
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\n#STAGER attach {url}/../no-such-dataset view\n")
    owner = (str(NOBODY.pw_uid), str(NOBODY.pw_gid))
    assert run_hook(settings, "setup", "12", *owner, "stager", "0", str(script)
                    ).returncode == 0
    done = run_hook(settings, "data_in", "12", str(script))
    assert done.returncode == 1
    assert done.stdout.startswith("attach (line 2) "), done.stdout
    assert "no-such-dataset" in done.stdout and "Traceback" not in done.stdout, done.stdout
    done = run_hook(settings, "teardown", "12", str(script), "false")
    assert done.returncode == 0, done.stdout
    assert "removed /bbjobs/12 " in done.stdout, done.stdout
    with Client(cluster.meta_url, token=cluster.admin_token) as admin:
        assert "/bbjobs/12/view" not in {a.path for a in admin.attachments()}
        assert not admin.exists("/bbjobs/12")


@pytest.mark.slow
def test_the_pool_slurm_draws_capacity_from_is_the_clusters_free_bytes(
        world: tuple[ThreadCluster, Path, str], tmp_path: Path) -> None:
    cluster, settings, _ = world
    done = run_hook(settings, "pools")
    assert done.returncode == 0, done.stdout
    [pool] = json.loads(done.stdout)["pools"]
    with Client(cluster.meta_url, token=cluster.admin_token) as admin:
        targets = admin.status()["targets"]
        free = sum(t["capacity"] - t["used"] for t in targets)
        assert pool == {"id": "stager", "quantity": pytest.approx(free, rel=0.01),
                        "granularity": 1}
        [status_token] = [t for t in admin.list_tokens() if t.name == "slurm-status"]
        assert status_token.revoked is not None               # its own, revoked at once
    down = tmp_path / "down.toml"
    down.write_text('meta_url = "http://127.0.0.1:9"\n')
    done = run_hook(down, "pools")                            # no cluster: no room
    assert done.returncode == 0
    assert json.loads(done.stdout) == {"pools": [{"id": "stager", "quantity": 0,
                                                  "granularity": 1}]}
