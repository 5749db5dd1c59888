"""What the Slurm hooks (:mod:`stager.stage.slurm`) share: their settings, the job's
record between hooks, and how each hook speaks to the cluster for a job.

The record (``state_dir/<job id>.json``, root's, 0600) holds the job's owner and
what teardown must undo: every token minted for the job, the ``--scratch`` copies
and the attached directories, each written the moment it exists, so a hook killed
later leaves nothing teardown cannot find.  Each hook's requests carry a token
minted for that hook and job on exactly the paths it touches (:func:`scoped`); the
settings' admin token only mints and revokes.
"""

from __future__ import annotations

import asyncio
import grp
import json
import os
import pwd
import tomllib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..config import DEFAULT_META_URL, Config, load_config
from ..errors import BadRequest, NotFound, SourceError, StagerError
from ..protocol import paths
from .directives import Directive, parse_directives
from .grants import Grants, Owner

if TYPE_CHECKING:
    from ..client import AsyncClient
    from ..protocol.authmsg import TokenCreated

T = TypeVar("T")
DEFAULT_SETTINGS = "/etc/stager/slurm.toml"
PENDING_JOB = "0"       # the job id directives are read with before the job has one


@dataclass(frozen=True)
class SlurmSettings:
    """What the hooks need to know: the cluster, and where jobs live in it."""

    meta_url: str = DEFAULT_META_URL
    token_file: str = ""                # read as root, before the hooks drop privileges
    ca_file: str = ""
    jobs_dir: str = "/jobs"             # each job's directory: JOBS_DIR/<job id>
    state_dir: str = "/var/lib/stager/slurm"   # each job's owner, between hooks
    directive: str = "STAGER"           # the word of burst_buffer.conf's Directive=
    job_token_ttl: int = 7 * 86400      # with auth: the life of a job's tokens, at
                                        # most (teardown revokes them when the job ends)
    grants: Grants = field(default_factory=Grants)   # [grants]: who may reach where

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None) -> SlurmSettings:
        """From a TOML file of these keys (a missing default file: the defaults)."""
        if path is None and not Path(DEFAULT_SETTINGS).exists():
            return cls()
        with open(path or DEFAULT_SETTINGS, "rb") as fh:
            data = tomllib.load(fh)
        where = path or DEFAULT_SETTINGS
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise BadRequest(f"{where}: unknown setting(s) "
                             f"{', '.join(unknown)}; known: {', '.join(sorted(known))}")
        kinds = {f.name: f.type for f in fields(cls)}
        raw_grants = data.pop("grants", {})
        try:
            settings = cls(**{k: int(v) if kinds[k] in (int, "int") else str(v)
                              for k, v in data.items()})
            return replace(settings, grants=Grants.parse(raw_grants, settings.jobs_dir))
        except ValueError as exc:
            raise BadRequest(f"{where}: {getattr(exc, 'message', exc)}") from None

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


def owner_of(uid: int, gid: int | None) -> Owner:
    """The user of ``uid`` and the names of its groups (``gid``, else its primary group,
    and its supplementary ones); a uid without a name matches no user grant."""
    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return Owner(f"#{uid}", frozenset(_group_names([] if gid is None else [gid])))
    name, gid = user.pw_name, user.pw_gid if gid is None else gid
    try:
        gids = os.getgrouplist(name, gid)
    except OSError:
        gids = [gid]
    return Owner(name, frozenset(_group_names(gids)))


def _group_names(gids: list[int]) -> list[str]:
    names = []
    for g in gids:
        try:
            names.append(grp.getgrgid(g).gr_name)
        except KeyError:
            pass
    return names


def write_private(path: Path, text: str) -> None:
    """``text`` into ``path`` (0600), whole or not at all."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    tmp.rename(path)


def become_owner(record: dict[str, Any]) -> None:
    """Drop root for the job's owner (recorded by :func:`setup`) before touching any
    source or destination.  Not root: nothing to drop."""
    if os.geteuid() != 0:
        return
    uid, gid = int(record["uid"]), int(record["gid"])
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


def job_record(settings: SlurmSettings, job_id: str) -> dict[str, Any]:
    """What :func:`setup` and the later hooks recorded of the job (root's, 0600)."""
    path = Path(settings.state_dir, f"{job_id}.json")
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        raise NotFound(f"no owner recorded for job {job_id} ({path}): slurm_bb_setup "
                       "did not run for it") from None


def remember(settings: SlurmSettings, job_id: str, key: str, value: str) -> None:
    """Add ``value`` to the record's list ``key`` (a token to revoke, a scratch copy to
    remove), at once: a hook killed later leaves nothing teardown cannot find."""
    path = Path(settings.state_dir, f"{job_id}.json")
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        Path(settings.state_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
        record = {}
    record.setdefault(key, []).append(value)
    write_private(path, json.dumps(record))


def mint(settings: SlurmSettings, job_id: str, purpose: str, scopes: tuple[str, ...],
          reach: list[str]) -> TokenCreated:
    """A token for the job (``purpose`` in its name), minted with the admin token and
    recorded for teardown's revocation the moment it exists."""
    name = f"slurm-job-{job_id}" + (f"-{purpose}" if purpose else "")
    created = with_client(settings.client_config(), lambda c: c.create_token(
        scopes, reach, settings.job_token_ttl, name))
    remember(settings, job_id, "tokens", created.info.id)
    return created


def scoped(settings: SlurmSettings, job_id: str, purpose: str, scopes: tuple[str, ...],
            reach: list[str]) -> Config:
    """The clients' configuration for one hook's work: with auth, a token of its own on
    exactly ``reach``, never the admin's; without, the settings' as they are."""
    config = settings.client_config()
    if not settings.token_file:
        return config
    return config.replace(token=mint(settings, job_id, purpose, scopes, reach).token)


def _home(uid: int) -> str:
    try:
        home = pwd.getpwuid(uid).pw_dir
    except KeyError:
        return "/"
    return home if os.path.isdir(home) else "/"


async def step(d: Directive, work: Awaitable[T]) -> T:
    """``work`` for directive ``d``; its failure names the directive's line."""
    where = f"{d.kind} (line {d.line}) {d.src} -> {d.dst}"
    try:
        return await work
    except StagerError as exc:
        raise type(exc)(f"{where}: {exc.message}", **exc.details) from exc
    except (OSError, ValueError) as exc:        # a backend's own error
        raise SourceError(f"{where}: {type(exc).__name__}: {exc}") from exc


def with_client(config: Config, work: Callable[[AsyncClient], Awaitable[T]]) -> T:
    from ..client import AsyncClient

    async def run() -> T:
        async with AsyncClient(config.meta_url, config=config) as client:
            return await work(client)

    return asyncio.run(run())
