"""``#STAGER attach SRC DST`` and ``#STAGER capacity=SIZE`` (issue 28): the directives,
their refusals, where a job may attach (the grants), and the hooks that attach, warm,
set the quota and detach, against a real cluster (tests/slurm/ runs them on a real
Slurm)."""

from __future__ import annotations

import pytest

from stager.stage.directives import Directive, DirectiveError, parse_directives
from stager.stage.grants import Access, Grants, NotGranted, Owner, confine


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
