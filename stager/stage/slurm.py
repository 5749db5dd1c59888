"""Slurm's ``burst_buffer/lua`` hooks, done in Python: ``deploy/slurm/burst_buffer.lua``
calls ``stager slurm HOOK ARGS…`` for each and maps the exit status to
``slurm.SUCCESS``/``slurm.ERROR``, the last line printed being the message Slurm
shows (the reason of a held job, sbatch's error).

The job's data moves between a *persistent* stager cluster (configured in a
TOML file, :class:`SlurmSettings`) and the job's sources and destinations while
the job is pending or finishing, so no node is allocated while data moves:

=============  ===========================================================
job_process    at sbatch time, quick: parse the directives, check every URL's
               protocol can be opened; a bad line rejects the job
setup          record the job's owner (uid, gid) under ``state_dir``; with auth,
               mint the job its own token (read and write on its directory
               and on its directives' stager paths only)
data_in        ``stage_in`` each source into the cluster, as the job's owner
paths          ``STAGER_META_URL``, ``STAGER_JOB_DIR`` (and the job's
               ``STAGER_TOKEN``) into the job's environment
data_out       ``stage_out`` each result, as the job's owner
teardown       remove ``/jobs/<id>`` and the record, revoke the job's token
               (also for a cancelled job)
=============  ===========================================================

The hooks run as root (inside ``slurmctld``); anything that reads a source or
writes a destination runs as the job's owner, so a job cannot stage in a file
its user could not read, nor write one out where its user could not.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import tomllib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ..config import DEFAULT_META_URL, Config, load_config
from ..errors import BadRequest, NotFound, SourceError, StagerError
from ..protocol import paths
from . import StageOptions, stage
from .directives import Directive, DirectiveError, parse_directives
from .source import filesystem_class

if TYPE_CHECKING:
    from ..client import AsyncClient

T = TypeVar("T")
DEFAULT_SETTINGS = "/etc/stager/slurm.toml"


@dataclass(frozen=True)
class SlurmSettings:
    """What the hooks need to know: the cluster, and where jobs live in it."""

    meta_url: str = DEFAULT_META_URL
    token_file: str = ""                # read as root, before the hooks drop privileges
    ca_file: str = ""
    jobs_dir: str = "/jobs"             # each job's directory: JOBS_DIR/<job id>
    state_dir: str = "/var/lib/stager/slurm"   # each job's owner, between hooks
    directive: str = "STAGER"           # the word of burst_buffer.conf's Directive=
    job_token_ttl: int = 7 * 86400      # with auth: the life of a job's own token, at
                                        # most (teardown revokes it when the job ends)

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None) -> SlurmSettings:
        """From a TOML file of these keys (a missing default file: the defaults)."""
        if path is None and not Path(DEFAULT_SETTINGS).exists():
            return cls()
        with open(path or DEFAULT_SETTINGS, "rb") as fh:
            data = tomllib.load(fh)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise BadRequest(f"{path or DEFAULT_SETTINGS}: unknown setting(s) "
                             f"{', '.join(unknown)}; known: {', '.join(sorted(known))}")
        kinds = {f.name: f.type for f in fields(cls)}
        try:
            return cls(**{k: int(v) if kinds[k] in (int, "int") else str(v)
                          for k, v in data.items()})
        except ValueError as exc:
            raise BadRequest(f"{path or DEFAULT_SETTINGS}: {exc}") from None

    def job_dir(self, job_id: str) -> str:
        return paths.normalize(f"{self.jobs_dir}/{job_id}")

    def client_config(self) -> Config:
        """The clients' configuration, the token already read (the file may be root's)."""
        config = load_config({"meta_url": self.meta_url, "ca_file": self.ca_file,
                              "token_file": self.token_file}, env={})
        return config.replace(token=config.bearer_token() or "", token_file="")


def read_directives(script: str | os.PathLike[str], settings: SlurmSettings,
                    job_id: str | None = None) -> list[Directive]:
    return parse_directives(Path(script).read_text(errors="replace"), word=settings.directive,
                            job_id=job_id, jobs_dir=settings.jobs_dir)


# -- the hooks --------------------------------------------------------------------------
def job_process(settings: SlurmSettings, script: str) -> str:
    """Reject a job whose directives are malformed or name a URL no installed fsspec
    backend can open.  Quick and offline: slurmctld waits for it.  Whether the source
    exists is data_in's question: a dependency may make it before the job starts."""
    directives = read_directives(script, settings)
    for d in directives:
        url = d.src if d.kind == "stage_in" else d.dst
        try:
            filesystem_class(url)
        except BadRequest as exc:
            raise DirectiveError(f"line {d.line}: {d.kind} {url}: {exc.message}") from None
    return f"{len(directives)} stager directive(s)"


def setup(settings: SlurmSettings, job_id: str, uid: str, gid: str,
          script: str | None = None) -> str:
    """Remember whose job it is (the later hooks get only its id).  With auth (a
    ``token_file`` in the settings, an admin token), mint the job a token of its own:
    read and write on its directory and its directives' stager paths, nothing else;
    :func:`paths_file` hands it to the job, :func:`teardown` revokes it."""
    state = Path(settings.state_dir)
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    record: dict[str, object] = {"uid": int(uid), "gid": int(gid)}
    said = f"job {job_id} of uid {uid}"
    if settings.token_file:
        prefixes = job_prefixes(settings, job_id, script)
        created = _with_client(settings.client_config(), lambda c: c.create_token(
            ["read", "write"], prefixes, settings.job_token_ttl, f"slurm-job-{job_id}"))
        _write_private(state / f"{job_id}.token", created.token + "\n")
        record["token_id"] = created.info.id
        said += f"; token {created.info.id} on {' '.join(prefixes)}"
    _write_private(state / f"{job_id}.json", json.dumps(record))
    return said


def job_prefixes(settings: SlurmSettings, job_id: str, script: str | None) -> list[str]:
    """Where a job's token reaches: its directory, and every stager path of its
    directives outside it."""
    found = [settings.job_dir(job_id)]
    if script is not None:
        for d in read_directives(script, settings, job_id):
            path = d.dst if d.kind == "stage_in" else d.src
            if not any(paths.is_within(path, p) for p in found):
                found.append(path)
    return found


def _write_private(path: Path, text: str) -> None:
    """``text`` into ``path`` (0600), whole or not at all."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    tmp.rename(path)


def data_in(settings: SlurmSettings, job_id: str, script: str) -> str:
    directives = [d for d in read_directives(script, settings, job_id) if d.kind == "stage_in"]
    config = settings.client_config()
    become_owner(settings, job_id)

    async def work(client: AsyncClient) -> str:
        await client.mkdir(settings.job_dir(job_id))
        done = []
        for d in directives:
            options = StageOptions(include=d.include, exclude=d.exclude, progress=False)
            report = await _step(d, stage(client, d.src, d.dst, options))
            done.append(f"{d.src} -> {d.dst}: {report.summary()}")
        return "; ".join(done) or "nothing to stage in"

    return _with_client(config, work)


def paths_file(settings: SlurmSettings, job_id: str, path_file: str) -> str:
    """The job's environment: where its cluster and its directory are."""
    lines = [f"STAGER_META_URL={settings.meta_url}",
             f"STAGER_JOB_DIR={settings.job_dir(job_id)}"]
    said = list(lines)
    token = Path(settings.state_dir, f"{job_id}.token")
    if token.exists():
        lines.append(f"STAGER_TOKEN={token.read_text().strip()}")
        said.append("STAGER_TOKEN=(the job's own)")
    with open(path_file, "a") as fh:
        fh.write("\n".join(lines) + "\n")
    return ", ".join(said)


def data_out(settings: SlurmSettings, job_id: str, script: str) -> str:
    directives = [d for d in read_directives(script, settings, job_id) if d.kind == "stage_out"]
    config = settings.client_config()
    become_owner(settings, job_id)

    async def work(client: AsyncClient) -> str:
        done = []
        for d in directives:
            options = StageOptions(progress=False, manifest=False)
            report = await _step(d, stage(client, f"stager://{d.src}", d.dst, options))
            done.append(f"{d.src} -> {d.dst}: {report.summary()}")
        return "; ".join(done) or "nothing to stage out"

    return _with_client(config, work)


def teardown(settings: SlurmSettings, job_id: str) -> str:
    """Remove the job's directory, revoke its token, drop its record; nothing there is
    not an error."""
    job_dir = settings.job_dir(job_id)
    record = Path(settings.state_dir, f"{job_id}.json")
    try:
        token_id = json.loads(record.read_text()).get("token_id")
    except FileNotFoundError:
        token_id = None

    async def work(client: AsyncClient) -> str:
        try:
            removed = await client.rm(job_dir, recursive=True)
        except NotFound:
            removed = 0
        said = f"removed {job_dir} ({removed} entries)"
        if token_id:
            try:
                await client.revoke_token(token_id)
            except NotFound:
                pass
            said += f"; token {token_id} revoked"
        return said

    message = _with_client(settings.client_config(), work)
    Path(settings.state_dir, f"{job_id}.token").unlink(missing_ok=True)
    record.unlink(missing_ok=True)
    return message


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

    return _with_client(settings.client_config(), work)


# -- helpers ----------------------------------------------------------------------------
def become_owner(settings: SlurmSettings, job_id: str) -> None:
    """Drop root for the job's owner (recorded by :func:`setup`) before touching any
    source or destination.  Not root: nothing to drop."""
    if os.geteuid() != 0:
        return
    record = Path(settings.state_dir, f"{job_id}.json")
    try:
        owner = json.loads(record.read_text())
    except FileNotFoundError:
        raise NotFound(f"no owner recorded for job {job_id} ({record}): slurm_bb_setup "
                       "did not run for it") from None
    uid, gid = int(owner["uid"]), int(owner["gid"])
    if uid == 0:
        raise BadRequest("a root job may not stage (Slurm forbids root burst buffers)")
    try:
        name = pwd.getpwuid(uid).pw_name
        groups = os.getgrouplist(name, gid)
    except KeyError:
        groups = [gid]
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)
    os.environ["HOME"] = _home(uid)


def _home(uid: int) -> str:
    try:
        home = pwd.getpwuid(uid).pw_dir
    except KeyError:
        return "/"
    return home if os.path.isdir(home) else "/"


async def _step(d: Directive, work: Awaitable[T]) -> T:
    """``work`` for directive ``d``; its failure names the directive's line."""
    where = f"{d.kind} (line {d.line}) {d.src} -> {d.dst}"
    try:
        return await work
    except StagerError as exc:
        raise type(exc)(f"{where}: {exc.message}", **exc.details) from exc
    except (OSError, ValueError) as exc:        # a backend's own error
        raise SourceError(f"{where}: {type(exc).__name__}: {exc}") from exc


def _with_client(config: Config, work: Callable[[AsyncClient], Awaitable[T]]) -> T:
    from ..client import AsyncClient

    async def run() -> T:
        async with AsyncClient(config.meta_url, config=config) as client:
            return await work(client)

    return asyncio.run(run())
