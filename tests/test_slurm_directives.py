"""#STAGER directives and the burst-buffer hooks that need no Slurm (tests/slurm/ runs
them all on a real one)."""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from stager import Client
from stager.errors import BadRequest, Forbidden, Unauthenticated
from stager.stage import slurm as hooks
from stager.stage.directives import Directive, DirectiveError, parse_directives
from stager.stage.grants import Access, Grant, Grants, NotGranted, Owner, confine, prefixes
from stager.testing import ThreadCluster

pytestmark = pytest.mark.slow      # the Slurm hooks as processes: not in make check

SCRIPT = """#!/bin/sh
#SBATCH --nodes=3

#STAGER stage_in https://h/imagenet /jobs/$SLURM_JOB_ID/in --include '*.tar' --include x/*
#OTHER stage_in ignored
#STAGER stage_out out \\
#STAGER   file:///project/results/${SLURM_JOB_ID}
srun python train.py
#STAGER stage_in after/the/first/command is/not/a/directive
"""


def test_directives_are_parsed_with_the_job_id_expanded() -> None:
    assert parse_directives(SCRIPT, job_id=42) == [
        Directive("stage_in", "https://h/imagenet", "/jobs/42/in", 4, ("*.tar", "x/*")),
        Directive("stage_out", "/jobs/42/out", "file:///project/results/42", 6),
    ]


def test_the_directive_word_and_the_jobs_directory_are_settings() -> None:
    script = "#!/bin/sh\n#BB stage_in s3://b/k data\n"
    assert parse_directives(script, word="BB", job_id=7, jobs_dir="/scratch") == [
        Directive("stage_in", "s3://b/k", "/scratch/7/data", 2)]
    assert parse_directives(script) == []           # #BB is not a #STAGER line
    assert parse_directives("#!/bin/sh\n#STAGERX stage_in a b\n") == []


@pytest.mark.parametrize(("line", "says"), [
    ("#STAGER stagein http://x/y in", "unknown directive 'stagein'"),
    ("#STAGER", "empty directive"),
    ("#STAGER stage_in http://x/y", "required: dst"),
    ("#STAGER stage_in http://x/y in more", "unexpected 'more'"),
    ("#STAGER stage_in http://x/y in --bogus", "unexpected '--bogus'"),
    ("#STAGER stage_in 'http://x/y in", "No closing quotation"),
    ("#STAGER stage_in http://x/$USER in", "only $SLURM_JOB_ID is expanded"),
    ("#STAGER stage_in /local/path in", "must be a URL outside stager"),
    ("#STAGER stage_in http://x/y stager://h:1/p", "name the stager side by its path"),
    ("#STAGER stage_in http://x/y ../../etc", "invalid path segment '..'"),
    ("#STAGER stage_out out /elsewhere", "must be a URL outside stager"),
    ("#STAGER stage_out out file:///r --include x", "stage_out takes no --include"),
    ("#STAGER stage_out out file:///r --scratch", "stage_out takes no --include/--exclude/"
                                                  "--scratch"),
])
def test_a_malformed_directive_names_its_line(line: str, says: str) -> None:
    with pytest.raises(DirectiveError) as err:
        parse_directives(f"#!/bin/sh\n#SBATCH -N 1\n{line}\n")
    assert str(err.value).startswith(f"line 3: {line.split(' ')[0]}"), err.value
    assert says in str(err.value)


def run_hook(settings: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stager", "slurm", args[0], "--config",
                           str(settings), *args[1:]], capture_output=True, text=True,
                          timeout=60)


def test_the_hooks_without_staging(cluster: ThreadCluster, tmp_path: Path) -> None:
    settings = tmp_path / "slurm.toml"
    settings.write_text(f'meta_url = "{cluster.meta_url}"\njobs_dir = "/bbjobs"\n'
                        f'state_dir = "{tmp_path / "state"}"\n')
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT.replace("/jobs/", "/bbjobs/"))
    done = run_hook(settings, "job_process", str(script))
    assert (done.returncode, done.stdout) == (0, "2 stager directive(s)\n")
    script.write_text("#!/bin/sh\n#STAGER stage_in nosuch://b/k in\n")
    done = run_hook(settings, "job_process", str(script))
    assert done.returncode == 1
    assert done.stdout.startswith("line 2: stage_in nosuch://b/k: unknown protocol 'nosuch'")

    assert run_hook(settings, "setup", "9", "1000", "1000", "stager", "0",
                    str(script)).returncode == 0
    assert (tmp_path / "state" / "9.json").read_text() == '{"uid": 1000, "gid": 1000}'
    env = tmp_path / "env"
    assert run_hook(settings, "paths", "9", str(script), str(env)).returncode == 0
    assert env.read_text() == (f"STAGER_META_URL={cluster.meta_url}\n"
                               "STAGER_JOB_DIR=/bbjobs/9\n")

    with Client(cluster.meta_url) as client:
        client.pipe("/bbjobs/9/out/a", b"x")
        done = run_hook(settings, "teardown", "9", str(script), "false")
        assert done.returncode == 0, done.stdout
        assert not client.exists("/bbjobs/9")
        assert not (tmp_path / "state" / "9.json").exists()
        # a job with nothing staged (cancelled while pending) tears down too
        assert run_hook(settings, "teardown", "10", str(script), "true").returncode == 0
        done = run_hook(settings, "status")
        assert done.returncode == 0 and "3/3 targets up" in done.stdout, done.stdout


def test_settings_refuse_unknown_keys(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('meta_url = "http://h:1"\njob_dir = "/x"\n')
    with pytest.raises(ValueError, match="unknown setting"):
        hooks.SlurmSettings.load(path)


ME = pwd.getpwuid(os.getuid()).pw_name


def test_with_auth_a_job_gets_its_own_tokens_and_loses_them_at_teardown(tmp_path: Path
                                                                        ) -> None:
    """setup mints the job a read+write token on its directory and its directives'
    read-write paths, and a read token on its read-only ones; paths hands them to the
    job; teardown removes the job's directory and nothing granted, and revokes them."""
    with ThreadCluster(tmp_path / "c", data_servers=1, auth=True) as cluster:
        admin = tmp_path / "admin.token"
        admin.write_text(cluster.admin_token)
        admin.chmod(0o600)
        settings = tmp_path / "slurm.toml"
        settings.write_text(f'meta_url = "{cluster.meta_url}"\njobs_dir = "/bbjobs"\n'
                            f'state_dir = "{tmp_path / "state"}"\ntoken_file = "{admin}"\n'
                            f'job_token_ttl = 3600\n[grants]\n"{ME}" = ["/shared", "ro:/ref"]\n')
        script = tmp_path / "job.sh"
        script.write_text("#!/bin/sh\n#STAGER stage_in https://h/ds /shared/ds7\n"
                          "#STAGER stage_out out file:///tmp/results\n"
                          "#STAGER stage_out /ref/set file:///tmp/ref\n")
        done = run_hook(settings, "setup", "7", str(os.getuid()), str(os.getgid()),
                        "stager", "0", str(script))
        assert done.returncode == 0, done.stdout
        assert "on /bbjobs/7 /shared/ds7;" in done.stdout and "on /ref/set" in done.stdout
        token_file = tmp_path / "state" / "7.job-token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        env = tmp_path / "env"
        assert run_hook(settings, "paths", "7", str(script), str(env)).returncode == 0
        lines = dict(line.split("=", 1) for line in env.read_text().splitlines())
        token, read_token = lines["STAGER_TOKEN"], lines["STAGER_READ_TOKEN"]
        assert token == token_file.read_text().strip()

        with Client(cluster.meta_url, token=cluster.admin_token) as admin_client:
            admin_client.pipe("/private/secret", b"not the job's")
            admin_client.pipe("/shared/other/x", b"granted, not named")
            admin_client.pipe("/ref/set/r", b"reference")
        with Client(cluster.meta_url, token=token) as job, \
                Client(cluster.meta_url, token=read_token) as reader:
            job.pipe("/bbjobs/7/out/a", b"result")
            job.pipe("/shared/ds7/x", b"data")
            assert job.cat("/bbjobs/7/out/a") == b"result"
            for denied in (lambda: job.pipe("/bbjobs/8/out/a", b"another job's"),
                           lambda: job.cat("/private/secret"),
                           lambda: job.cat("/shared/other/x"),      # not in a directive
                           lambda: job.cat("/ref/set/r"),           # read-only: not this one
                           lambda: reader.pipe("/ref/set/w", b"x"),
                           lambda: reader.cat("/bbjobs/7/out/a")):
                with pytest.raises(Forbidden):
                    denied()
            assert reader.cat("/ref/set/r") == b"reference"
            assert [e.path for e in job.ls("/")] == ["/bbjobs", "/shared"]   # not /private
            done = run_hook(settings, "teardown", "7", str(script), "false")
            assert done.returncode == 0, done.stdout
            assert "3 token(s) revoked" in done.stdout       # job, read, teardown's own
            with pytest.raises(Unauthenticated):
                job.stat("/shared/ds7/x", cached=False)
        assert not token_file.exists()
        with Client(cluster.meta_url, token=cluster.admin_token) as admin_client:
            assert not admin_client.exists("/bbjobs/7")
            assert admin_client.cat("/shared/ds7/x") == b"data"    # no --scratch: kept
            minted = {t.name: t for t in admin_client.list_tokens()
                      if t.name.startswith("slurm-job-7")}
        assert set(minted) == {"slurm-job-7", "slurm-job-7-read", "slurm-job-7-teardown"}
        assert all(t.revoked for t in minted.values())
        assert minted["slurm-job-7-teardown"].prefixes == ("/bbjobs/7",)
        # `scontrol show bbstat` reads with a token of its own, revoked once it answered
        done = run_hook(settings, "status")
        assert done.returncode == 0 and "1/1 targets up" in done.stdout, done.stdout
        with Client(cluster.meta_url, token=cluster.admin_token) as admin_client:
            [status_token] = [t for t in admin_client.list_tokens()
                              if t.name == "slurm-status"]
        assert status_token.scopes == ("read",) and status_token.prefixes == ("/bbjobs",)
        assert status_token.revoked is not None


def test_setup_refuses_a_path_its_user_holds_no_grant_for(tmp_path: Path) -> None:
    settings = tmp_path / "slurm.toml"
    settings.write_text('meta_url = "http://127.0.0.1:9"\n'
                        f'state_dir = "{tmp_path / "state"}"\n'
                        '[grants]\n"@no-such-group-of-stager" = ["/team"]\n')
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#STAGER stage_out /team/x file:///tmp/x\n")
    done = run_hook(settings, "setup", "7", str(os.getuid()), str(os.getgid()),
                    "stager", "0", str(script))
    assert done.returncode == 1
    assert done.stdout.startswith("line 2: stage_out /team/x file:///tmp/x: /team/x is "
                                  "outside the job's directory /jobs/7"), done.stdout
    assert not (tmp_path / "state" / "7.json").exists()      # nothing recorded, no token


# -- the confinement policy, pure ---------------------------------------------------------
GRANTS = Grants.parse({"alice": ["/scratch/alice"],
                       "@team-a": ["/datasets/team-a", "ro:/datasets/ref"],
                       "@team-b": ["/datasets/team-b"]}, "/jobs")
ALICE = Owner("alice", frozenset({"team-a", "users"}))
BOB = Owner("bob", frozenset({"users"}))


def directives(*lines: str, job: int = 5) -> list[Directive]:
    return parse_directives("#!/bin/sh\n" + "".join(f"#STAGER {x}\n" for x in lines),
                            job_id=job)


def reach(owner: Owner, *lines: str) -> list[Access]:
    return confine(directives(*lines), "/jobs/5", GRANTS.of(owner), owner)


def test_grants_parse_users_groups_and_read_only_prefixes() -> None:
    assert GRANTS.of(ALICE) == (Grant("/scratch/alice", True), Grant("/datasets/team-a", True),
                                Grant("/datasets/ref", False))
    assert GRANTS.of(BOB) == ()
    assert len(GRANTS.of(Owner(None))) == 4                    # sbatch without a user: all
    assert str(GRANTS.of(ALICE)[2]) == "ro:/datasets/ref"


@pytest.mark.parametrize(("raw", "says"), [
    ({"a": "/x"}, "a list of prefixes"),
    ({"a": ["x"]}, "not an absolute stager path"),
    ({"a": ["/jobs/1"]}, "overlaps the jobs' directory"),
    ({"a": ["/"]}, "overlaps the jobs' directory"),
    ({"@": ["/x"]}, "neither a user nor an @group"),
    ({"a": ["/x/../y"]}, "invalid path segment"),
    (["/x"], "must be a table"),
])
def test_grants_refuse_what_would_reach_too_far(raw: object, says: str) -> None:
    with pytest.raises(BadRequest, match=says):
        Grants.parse(raw, "/jobs")


def test_settings_read_the_grants_table(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('jobs_dir = "/j"\n[grants]\n"@t" = ["/d/t", "ro:/d/r"]\n')
    assert hooks.SlurmSettings.load(path).grants.of(Owner("u", frozenset({"t"}))) == (
        Grant("/d/t", True), Grant("/d/r", False))
    path.write_text('jobs_dir = "/j"\n[grants]\n"@t" = ["/j/1"]\n')
    with pytest.raises(BadRequest, match="overlaps the jobs' directory /j"):
        hooks.SlurmSettings.load(path)
    shipped = Path(__file__).parents[1] / "deploy" / "slurm" / "slurm.toml"
    assert hooks.SlurmSettings.load(shipped).grants == Grants({})


def test_a_job_reaches_its_directory_and_what_its_directives_name_below_its_grants() -> None:
    assert reach(BOB, "stage_in https://h/d in", "stage_out out file:///r") == [
        Access("/jobs/5", True)]
    assert reach(ALICE, "stage_in https://h/d /datasets/team-a/d", "stage_out out file:///r",
                 "stage_out /datasets/ref/imagenet file:///r",
                 "stage_in https://h/t /datasets/team-a/tmp-$SLURM_JOB_ID --scratch") == [
        Access("/jobs/5", True), Access("/datasets/team-a/d", True),
        Access("/datasets/ref/imagenet", False), Access("/datasets/team-a/tmp-5", True, True)]


@pytest.mark.parametrize(("owner", "line", "says"), [
    (BOB, "stage_out /datasets/team-a file:///x",
     "/datasets/team-a is outside the job's directory /jobs/5 and slurm.toml's [grants] "
     "give user bob (groups users) nothing there"),
    (ALICE, "stage_out /datasets/team-b/x file:///x", "give user alice"),
    (ALICE, "stage_in https://h/d /elsewhere", "/elsewhere is outside the job's directory"),
    (ALICE, "stage_in https://h/d /jobs/6/in", "/jobs/6/in is outside the job's directory"),
    (ALICE, "stage_in https://h/d /datasets/ref/x",
     "/datasets/ref/x is granted read-only to user alice (groups team-a, users) "
     "(ro:/datasets/ref); stage_in writes there"),
    (ALICE, "stage_in https://h/d /datasets/team-a --scratch",
     "--scratch names the granted prefix /datasets/team-a itself"),
    (ALICE, "stage_in https://h/d /datasets/team-ab/x", "outside the job's directory"),
    (Owner(None), "stage_in https://h/d /nobody/x",
     "slurm.toml's [grants] give any user nothing there"),
    (Owner(None), "stage_in https://h/d /datasets/ref/x", "granted read-only to any user"),
])
def test_anything_else_is_refused_naming_the_line(owner: Owner, line: str, says: str) -> None:
    with pytest.raises(NotGranted) as err:
        reach(owner, "stage_in https://h/d in", line)
    kind, src, dst = line.split()[:3]
    assert str(err.value).startswith(f"line 3: {kind} {src} {dst.replace('$', '')}"), err.value
    assert says in str(err.value)
    assert isinstance(err.value, PermissionError)


def test_a_token_covers_each_path_once_in_its_mode() -> None:
    accesses = [Access("/jobs/5", True), Access("/jobs/5/in", True), Access("/d/a", True),
                Access("/d/a/x", True, True), Access("/d/r", False), Access("/d/r/x", False),
                Access("/d/a", True)]
    assert prefixes(accesses, writable=True) == ["/jobs/5", "/d/a"]
    assert prefixes(accesses, writable=False) == ["/d/r"]


def test_job_process_checks_the_user_it_is_told_and_any_user_when_not(tmp_path: Path
                                                                      ) -> None:
    group = grp.getgrgid(os.getgid()).gr_name
    settings = tmp_path / "slurm.toml"
    settings.write_text(f'state_dir = "{tmp_path / "state"}"\n[grants]\n'
                        f'"@{group}" = ["/mine"]\n"someone-else-of-stager" = ["/theirs"]\n')
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH -N 1\n#STAGER stage_out /theirs/x file:///tmp/x\n")
    me = (str(os.getuid()), str(os.getgid()))
    done = run_hook(settings, "job_process", str(script), *me)
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1].startswith("line 3: stage_out /theirs/x file:///tmp/x:"
                                                   " /theirs/x is outside the job's directory")
    assert run_hook(settings, "job_process", str(script)).returncode == 0   # someone's
    script.write_text("#!/bin/sh\n#STAGER stage_out /mine/x file:///tmp/x\n")
    assert run_hook(settings, "job_process", str(script), *me).returncode == 0  # by group
    script.write_text("#!/bin/sh\n#STAGER stage_out /nobodys file:///tmp/x\n")
    done = run_hook(settings, "job_process", str(script))
    assert done.returncode == 1 and "give any user nothing there" in done.stdout


def test_a_scratch_copy_must_be_new_and_teardown_removes_only_that(cluster: ThreadCluster,
                                                                   tmp_path: Path) -> None:
    """data_in makes each --scratch destination itself (and records it) before staging;
    one that exists already (another job's, a team's) fails the job and is never
    removed; teardown removes the scratch copies this job made, not the rest of the
    grant."""
    settings = tmp_path / "slurm.toml"
    settings.write_text(f'meta_url = "{cluster.meta_url}"\njobs_dir = "/sj"\n'
                        f'state_dir = "{tmp_path / "state"}"\n[grants]\n"{ME}" = ["/team"]\n')
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a")
    script = tmp_path / "job.sh"
    owner = (str(os.getuid()), str(os.getgid()))
    with Client(cluster.meta_url) as client:
        client.pipe("/team/taken/theirs", b"someone's")
        client.pipe("/team/kept", b"the team's")
        script.write_text(f"#!/bin/sh\n#STAGER stage_in file://{src} /team/taken --scratch\n")
        assert run_hook(settings, "setup", "3", *owner, "stager", "0", str(script)
                        ).returncode == 0
        done = run_hook(settings, "data_in", "3", str(script))
        assert done.returncode == 1
        assert "--scratch /team/taken exists already" in done.stdout, done.stdout
        assert run_hook(settings, "teardown", "3", str(script), "false").returncode == 0
        assert client.cat("/team/taken/theirs") == b"someone's"

        script.write_text(f"#!/bin/sh\n#STAGER stage_in file://{src} /team/tmp-$SLURM_JOB_ID "
                          "--scratch\n")
        assert run_hook(settings, "setup", "4", *owner, "stager", "0", str(script)
                        ).returncode == 0
        run_hook(settings, "data_in", "4", str(script))    # as root: refused after mkdir
        assert client.exists("/team/tmp-4")
        done = run_hook(settings, "teardown", "4", str(script), "false")
        assert done.returncode == 0 and "removed /team/tmp-4" in done.stdout, done.stdout
        assert not client.exists("/team/tmp-4")
        assert client.cat("/team/kept") == b"the team's"
        assert client.cat("/team/taken/theirs") == b"someone's"
