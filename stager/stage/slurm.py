"""Slurm's ``burst_buffer/lua`` hooks, done in Python: ``deploy/slurm/burst_buffer.lua``
calls ``stager slurm HOOK ARGS…`` for each and maps the exit status to
``slurm.SUCCESS``/``slurm.ERROR``, the last line printed being the message Slurm
shows (the reason of a held job, sbatch's error).

The job's data moves between a *persistent* stager cluster (configured in a
TOML file, :class:`SlurmSettings`) and the job's sources and destinations while
the job is pending or finishing, so no node is allocated while data moves:

=============  ===========================================================
job_process    at sbatch time, quick: parse the directives, check every URL's
               protocol can be opened and every stager path is the job's or
               granted to its owner; a bad line rejects the job
setup          check the grants again, record the job's owner (uid, gid) under
               ``state_dir``; with auth, mint the job its own token (read and
               write on its directory and its read-write paths only);
               ``capacity=SIZE``: the job directory's quota
data_in        ``attach`` each source and warm it, with an admin token on exactly
               the attached directories; ``stage_in`` each source into the
               cluster, as the job's owner, with a token on exactly its destinations
paths          ``STAGER_META_URL``, ``STAGER_JOB_DIR`` (and the job's
               ``STAGER_TOKEN``) into the job's environment
data_out       ``stage_out`` each result, as the job's owner, with a read token
               on exactly its sources
teardown       detach the job's attached directories, remove ``/jobs/<id>`` and
               the job's ``--scratch`` copies, revoke every token minted for it,
               drop the record (also for a cancelled job)
=============  ===========================================================

Where a job may reach is :mod:`stager.stage.grants`' policy: its directory, and the
prefixes ``slurm.toml``'s ``[grants]`` give its Unix user or groups.  The admin
token of the settings only mints and revokes; each hook's stager requests carry a
token minted for that hook and job on exactly the paths it touches.  The settings,
the job's record between hooks and those tokens are :mod:`stager.stage.slurmjob`'s.

The hooks run as root (inside ``slurmctld``); anything that reads a source or
writes a destination runs as the job's owner, so a job cannot stage in a file
its user could not read, nor write one out where its user could not.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import AlreadyExists, BadRequest, NotFound, StagerError
from ..protocol import paths
from ..sources.open import filesystem_class
from . import StageOptions, stage
from .directives import Directive, DirectiveError
from .grants import Access, Owner, confine, prefixes
from .slurmjob import (
    DEFAULT_SETTINGS,
    PENDING_JOB,
    SlurmSettings,
    become_owner,
    job_record,
    mint,
    owner_of,
    read_directives,
    remember,
    scoped,
    step,
    with_client,
    write_private,
)

if TYPE_CHECKING:
    from ..client import AsyncClient
    from ..protocol.authmsg import TokenCreated

__all__ = ["DEFAULT_SETTINGS", "SlurmSettings", "data_in", "data_out", "job_process",
           "paths_file", "pools", "setup", "status", "teardown"]
T = TypeVar("T")


# -- the hooks --------------------------------------------------------------------------
def job_process(settings: SlurmSettings, script: str, uid: str | None = None,
                gid: str | None = None) -> str:
    """Reject a job whose directives are malformed, name a URL no installed fsspec
    backend can open, or reach a stager path its owner holds no grant for.  Quick and
    offline: slurmctld waits for it.  Slurm before 23.02 does not say whose job it is
    (``uid`` None): then only paths no one is granted are refused here, the rest by
    :func:`setup` -- or here too, through ``deploy/slurm/job_submit.lua``.  Whether
    a source exists is data_in's question: a dependency may make it before the job
    starts."""
    directives = read_directives(script, settings)
    for d in directives:
        url = {"stage_in": d.src, "attach": d.src, "stage_out": d.dst}.get(d.kind)
        if url is None:
            continue
        try:
            filesystem_class(url)
        except BadRequest as exc:
            raise DirectiveError(f"line {d.line}: {d.kind} {url}: {exc.message}") from None
    owner = Owner(None) if uid is None else owner_of(int(uid), None if gid is None else int(gid))
    accesses(settings, directives, settings.job_dir(PENDING_JOB), owner)
    return f"{len(directives)} stager directive(s)"


def setup(settings: SlurmSettings, job_id: str, uid: str, gid: str,
          script: str | None = None) -> str:
    """Check the job's directives against its owner's grants (they may have changed
    since sbatch) and remember whose job it is (the later hooks get only its id).
    With auth (a ``token_file`` in the settings, an admin token), mint the job its own
    token: read and write on its directory and its read-write paths, nothing else
    (and a read token for its read-only ones); :func:`paths_file` hands them to the
    job, :func:`teardown` revokes them."""
    owner = owner_of(int(uid), int(gid))
    directives = read_directives(script, settings, job_id) if script is not None else []
    reach = accesses(settings, directives, settings.job_dir(job_id), owner)
    state = Path(settings.state_dir)
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        record = job_record(settings, job_id)      # setup again: keep the tokens to revoke
    except NotFound:
        record = {}
    write_private(state / f"{job_id}.json",
                   json.dumps({**record, "uid": int(uid), "gid": int(gid)}))
    said = f"job {job_id} of {owner}"
    if settings.token_file:
        for kind, scopes, writable in (("", ("read", "write"), True), ("read", ("read",), False)):
            reach_mode = prefixes(reach, writable=writable)
            if reach_mode:
                token = mint(settings, job_id, kind, scopes, reach_mode)
                write_private(state / f"{job_id}.{kind or 'job'}-token", token.token + "\n")
                said += f"; {kind or 'job'} token {token.info.id} on {' '.join(reach_mode)}"
    capacity = next((d.capacity for d in directives if d.capacity is not None), None)
    if capacity is not None:
        said += "; " + _set_capacity(settings, job_id, capacity)
    return said


def _set_capacity(settings: SlurmSettings, job_id: str, nbytes: int) -> str:
    """``capacity=SIZE``: the job directory's quota, set with a token of its own (admin
    on exactly that directory: a quota is an admin's to set)."""
    job_dir = settings.job_dir(job_id)
    config = scoped(settings, job_id, "capacity", ("admin",), [job_dir])

    async def work(client: AsyncClient) -> str:
        await client.mkdir(job_dir)
        quota = await client.set_quota(job_dir, max_bytes=nbytes)
        return f"quota of {job_dir}: {quota.bytes} bytes"

    return with_client(config, work)


def accesses(settings: SlurmSettings, directives: list[Directive], job_dir: str,
             owner: Owner) -> list[Access]:
    """:func:`~stager.stage.grants.confine` with the settings' grants of ``owner``."""
    return confine(directives, job_dir, settings.grants.of(owner), owner)


def data_in(settings: SlurmSettings, job_id: str, script: str) -> str:
    """Attach and warm each ``attach`` (:func:`attach_in`), then stage each
    ``stage_in`` in, as the job's owner, with a token on exactly its destinations and
    the job's directory.  A ``--scratch`` destination must be new: this hook makes it
    (and records it for teardown) before anything is staged."""
    record = job_record(settings, job_id)
    directives = _checked(settings, job_id, script, record)
    attached = attach_in(settings, job_id, [d for d in directives if d.kind == "attach"])
    ins = [d for d in directives if d.kind == "stage_in"]
    job_dir = settings.job_dir(job_id)
    config = scoped(settings, job_id, "stage-in", ("read", "write"),
                     prefixes([Access(job_dir, True), *(Access(d.dst, True) for d in ins)]))
    scratch = [d.dst for d in ins if d.scratch and not paths.is_within(d.dst, job_dir)]

    async def work(client: AsyncClient) -> str:
        await client.mkdir(job_dir)
        for path in scratch:
            try:
                await client.mkdir(path, exist_ok=False)
            except AlreadyExists:
                raise AlreadyExists(f"--scratch {path} exists already: a scratch copy "
                                    "must be new (teardown removes it)", path=path) from None
            remember(settings, job_id, "scratch", path)
        become_owner(record)
        done = []
        for d in ins:
            options = StageOptions(include=d.include, exclude=d.exclude, progress=False)
            report = await step(d, stage(client, d.src, d.dst, options))
            done.append(f"{d.src} -> {d.dst}: {report.summary()}")
        return "; ".join(attached + done) or "nothing to stage in"

    return with_client(config, work)


def attach_in(settings: SlurmSettings, job_id: str, attaches: list[Directive]) -> list[str]:
    """Attach each directory to its source and warm it, with a token of its own: admin
    (attaching is an admin's) on exactly the attached directories.  The servers read
    the source, not this process, so nothing here runs as the job's owner; each
    directory is recorded for teardown's detach before it is attached."""
    if not attaches:
        return []
    for d in attaches:
        remember(settings, job_id, "attached", d.dst)
    config = scoped(settings, job_id, "attach", ("admin",),
                     prefixes([Access(d.dst, True) for d in attaches]))

    async def work(client: AsyncClient) -> list[str]:
        from ..client.warm import warm

        done = []
        for d in attaches:
            listed = await step(d, client.attach(d.src, d.dst, refresh=d.refresh,
                                                  include=d.include, exclude=d.exclude))
            files = listed.attachment.files
            warmed = await step(d, warm(client, d.dst)) if files else None
            fetched = f", {warmed.bytes_fetched} bytes fetched" if warmed else ""
            done.append(f"{d.src} -> {d.dst}: attached, {files} files, "
                        f"{listed.attachment.bytes} bytes{fetched}")
        return done

    return with_client(config, work)


def paths_file(settings: SlurmSettings, job_id: str, path_file: str) -> str:
    """The job's environment: where its cluster and its directory are, and its tokens."""
    lines = [f"STAGER_META_URL={settings.meta_url}",
             f"STAGER_JOB_DIR={settings.job_dir(job_id)}"]
    said = list(lines)
    for kind, variable in (("job", "STAGER_TOKEN"), ("read", "STAGER_READ_TOKEN")):
        token = Path(settings.state_dir, f"{job_id}.{kind}-token")
        if token.exists():
            lines.append(f"{variable}={token.read_text().strip()}")
            said.append(f"{variable}=(the job's own)")
    with open(path_file, "a") as fh:
        fh.write("\n".join(lines) + "\n")
    return ", ".join(said)


def data_out(settings: SlurmSettings, job_id: str, script: str) -> str:
    """Stage each ``stage_out`` out, as the job's owner, with a read token on exactly
    its sources."""
    record = job_record(settings, job_id)
    outs = [d for d in _checked(settings, job_id, script, record) if d.kind == "stage_out"]
    if not outs:
        return "nothing to stage out"
    config = scoped(settings, job_id, "stage-out", ("read",),
                     prefixes([Access(d.src, False) for d in outs]))

    async def work(client: AsyncClient) -> str:
        become_owner(record)
        done = []
        for d in outs:
            options = StageOptions(progress=False, manifest=False)
            report = await step(d, stage(client, f"stager://{d.src}", d.dst, options))
            done.append(f"{d.src} -> {d.dst}: {report.summary()}")
        return "; ".join(done)

    return with_client(config, work)


def teardown(settings: SlurmSettings, job_id: str) -> str:
    """Remove the job's directory and its ``--scratch`` copies (nothing else: a
    granted directory stays), with a token on exactly those; then revoke every token
    minted for the job and drop its record.  Nothing there is not an error (a job
    cancelled before setup)."""
    job_dir = settings.job_dir(job_id)
    try:
        record = job_record(settings, job_id)
    except NotFound:
        record = {}
    scratch = [str(p) for p in record.get("scratch", [])]
    attached = [str(p) for p in record.get("attached", [])]
    said = [_detach_all(settings, job_id, attached)] if attached else []
    config = scoped(settings, job_id, "teardown", ("read", "write"), [job_dir, *scratch])

    async def work(client: AsyncClient) -> str:
        for path in (job_dir, *scratch):
            try:
                removed = await client.rm(path, recursive=True)
            except NotFound:
                removed = 0
            said.append(f"removed {path} ({removed} entries)")
        return "; ".join(said)

    message = with_client(config, work)
    tokens = job_record(settings, job_id).get("tokens", []) if settings.token_file else []
    if tokens:
        with_client(settings.client_config(), lambda c: _revoke(c, tokens))
        message += f"; {len(tokens)} token(s) revoked"
    for name in (f"{job_id}.job-token", f"{job_id}.read-token", f"{job_id}.json"):
        Path(settings.state_dir, name).unlink(missing_ok=True)
    return message


def _detach_all(settings: SlurmSettings, job_id: str, attached: list[str]) -> str:
    """Detach the job's attached directories (their cached bytes freed; one never
    attached, as when the source failed, is nothing to do), with a token of its own:
    admin on exactly those."""
    config = scoped(settings, job_id, "detach", ("admin",),
                     prefixes([Access(p, True) for p in attached]))

    async def work(client: AsyncClient) -> str:
        said = []
        for path in attached:
            try:
                gone = await client.detach(path)
                said.append(f"detached {path} ({gone.files} files, {gone.chunks} cached "
                            "chunks freed)")
            except NotFound:
                pass
        return "; ".join(said) or "nothing attached"

    return with_client(config, work)


async def _revoke(client: AsyncClient, token_ids: list[str]) -> None:
    for token_id in token_ids:
        try:
            await client.revoke_token(token_id)
        except NotFound:
            pass


STATUS_TOKEN_TTL = 120         # seconds: the status hook's own read token, revoked after


def status(settings: SlurmSettings) -> str:
    """``scontrol show bbstat``: the cluster's health and the jobs' directories."""

    async def work(client: AsyncClient) -> str:
        report = await client.status()
        try:
            jobs = [f.name for f in await client.ls(settings.jobs_dir)]
        except NotFound:
            jobs = []
        targets = report.get("targets", [])
        up = sum(t.get("state") == "up" for t in targets)
        return (f"stager {settings.meta_url}: {up}/{len(targets)} targets up; "
                f"{len(jobs)} job dir(s) under {settings.jobs_dir}: {' '.join(jobs) or '-'}")

    return _reading(settings, work)


POOL = "stager"


def pools(settings: SlurmSettings) -> str:
    """``slurm_bb_pools``: one pool whose quantity is the cluster's free bytes now (its
    targets that are up: capacity less used), so Slurm starts no more ``capacity=``
    than fits and a job that asks for more waits.  Slurm subtracts what its running
    jobs hold of the pool; their bytes already written count twice then, erring on
    the side of waiting.  A cluster that does not answer has no free bytes: jobs that
    ask for a capacity wait, the others do not."""

    async def work(client: AsyncClient) -> int:
        targets = (await client.status()).get("targets", [])
        return sum(max(0, t["capacity"] - t["used"]) for t in targets if t["state"] == "up")

    try:
        free = _reading(settings, work)
    except (StagerError, OSError, ValueError):
        free = 0
    return json.dumps({"pools": [{"id": POOL, "quantity": free, "granularity": 1}]})


def _reading(settings: SlurmSettings, work: Callable[[AsyncClient], Awaitable[T]]) -> T:
    """``work`` with a token of its own (read on ``jobs_dir``, revoked at once), not
    the admin's: the status and pools hooks."""
    config = settings.client_config()
    made: TokenCreated | None = None
    if settings.token_file:
        made = with_client(config, lambda c: c.create_token(
            ("read",), [settings.jobs_dir], STATUS_TOKEN_TTL, "slurm-status"))
        config = config.replace(token=made.token)
    try:
        return with_client(config, work)
    finally:
        if made is not None:
            token_id = made.info.id
            with_client(settings.client_config(), lambda c: c.revoke_token(token_id))


def _checked(settings: SlurmSettings, job_id: str, script: str,
             record: dict[str, Any]) -> list[Directive]:
    """The job's directives, confined again (grants may have changed since setup)."""
    directives = read_directives(script, settings, job_id)
    accesses(settings, directives, settings.job_dir(job_id),
             owner_of(int(record["uid"]), int(record["gid"])))
    return directives


