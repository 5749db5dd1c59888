"""#STAGER directives and the burst-buffer hooks that need no Slurm (tests/slurm/ runs
them all on a real one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stager import Client
from stager.errors import Forbidden, Unauthenticated
from stager.stage import slurm as hooks
from stager.stage.directives import Directive, DirectiveError, parse_directives
from stager.testing import ThreadCluster

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
    script.write_text(SCRIPT)
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


def test_with_auth_a_job_gets_its_own_token_and_loses_it_at_teardown(tmp_path: Path) -> None:
    """setup mints the job a read+write token on its directory and its directives'
    stager paths; paths hands it to the job; teardown revokes it."""
    with ThreadCluster(tmp_path / "c", data_servers=1, auth=True) as cluster:
        admin = tmp_path / "admin.token"
        admin.write_text(cluster.admin_token)
        admin.chmod(0o600)
        settings = tmp_path / "slurm.toml"
        settings.write_text(f'meta_url = "{cluster.meta_url}"\njobs_dir = "/bbjobs"\n'
                            f'state_dir = "{tmp_path / "state"}"\ntoken_file = "{admin}"\n'
                            "job_token_ttl = 3600\n")
        script = tmp_path / "job.sh"
        script.write_text("#!/bin/sh\n#STAGER stage_in https://h/ds /shared/ds7\n"
                          "#STAGER stage_out out file:///tmp/results\n")
        done = run_hook(settings, "setup", "7", "1000", "1000", "stager", "0", str(script))
        assert done.returncode == 0, done.stdout
        assert "on /bbjobs/7 /shared/ds7" in done.stdout
        token_file = tmp_path / "state" / "7.token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        env = tmp_path / "env"
        assert run_hook(settings, "paths", "7", str(script), str(env)).returncode == 0
        lines = dict(line.split("=", 1) for line in env.read_text().splitlines())
        token = lines["STAGER_TOKEN"]
        assert token == token_file.read_text().strip()

        with Client(cluster.meta_url, token=cluster.admin_token) as admin_client:
            admin_client.pipe("/private/secret", b"not the job's")
        with Client(cluster.meta_url, token=token) as job:
            job.pipe("/bbjobs/7/out/a", b"result")
            job.pipe("/shared/ds7/x", b"data")
            assert job.cat("/bbjobs/7/out/a") == b"result"
            with pytest.raises(Forbidden):
                job.pipe("/bbjobs/8/out/a", b"another job's")
            with pytest.raises(Forbidden):
                job.cat("/private/secret")
            assert [e.path for e in job.ls("/")] == ["/bbjobs", "/shared"]   # not /private
            done = run_hook(settings, "teardown", "7", str(script), "false")
            assert done.returncode == 0, done.stdout
            assert "revoked" in done.stdout
            with pytest.raises(Unauthenticated):
                job.stat("/shared/ds7/x", cached=False)
        assert not token_file.exists()
        with Client(cluster.meta_url, token=cluster.admin_token) as admin_client:
            assert not admin_client.exists("/bbjobs/7")
            assert admin_client.cat("/shared/ds7/x") == b"data"    # outside the job dir: kept
