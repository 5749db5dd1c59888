"""Where a Slurm job may reach in stager: its own directory, and what ``slurm.toml``
grants its Unix user or groups.

::

    [grants]
    "alice"   = ["/scratch/alice"]                               # user alice: read-write
    "@team-a" = ["/datasets/team-a", "ro:/datasets/imagenet"]    # group team-a; ro: read-only

A key is a Unix user name, or ``@`` and a Unix group name (every member, by primary
or supplementary group).  A prefix is read-write, or read-only when written
``ro:/path``.  No grant may cover the jobs' directory or lie inside it: a job reaches
its own directory, never another job's.

:func:`confine` is the whole policy, a pure function of a job's directives, its
directory, and the grants of its owner: a ``stage_in`` or an ``attach`` writes, so its
destination must be in the job's directory or below a read-write grant; a
``stage_out`` reads, so its source may also be below a read-only one.  ``--scratch`` marks a
``stage_in`` copy outside the job's directory that teardown removes; it goes below a
grant, never onto the granted prefix itself.  Anything else is refused, naming the
directive's line and why.  The accesses it returns are exactly what the job's tokens
and the staging tokens cover.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import BadRequest, Forbidden
from ..protocol import paths
from .directives import Directive

__all__ = ["Access", "Grant", "Grants", "NotGranted", "Owner", "confine", "merge"]

READ_ONLY = "ro:"


class NotGranted(Forbidden):
    """A directive reaches where its job may not; the message names the line."""


@dataclass(frozen=True)
class Grant:
    prefix: str
    writable: bool

    def __str__(self) -> str:
        return self.prefix if self.writable else READ_ONLY + self.prefix


@dataclass(frozen=True)
class Owner:
    """Whom a job runs for: a Unix user name and its groups' names; ``user=None``
    stands for "some user" (the check at sbatch where Slurm does not say who)."""

    user: str | None
    groups: frozenset[str] = frozenset()

    def __str__(self) -> str:
        if self.user is None:
            return "any user"
        groups = f" (groups {', '.join(sorted(self.groups))})" if self.groups else ""
        return f"user {self.user}{groups}"


@dataclass(frozen=True)
class Grants:
    """``slurm.toml``'s ``[grants]``: key (``"alice"``, ``"@team-a"``) -> prefixes."""

    table: Mapping[str, tuple[Grant, ...]] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: object, jobs_dir: str) -> Grants:
        """From the TOML table; :class:`BadRequest` naming the key at fault."""
        if not isinstance(raw, Mapping):
            raise BadRequest("[grants] must be a table: \"user\" or \"@group\" = [prefixes]")
        jobs = paths.normalize(jobs_dir)
        table: dict[str, tuple[Grant, ...]] = {}
        for key, prefixes in raw.items():
            if not key.lstrip("@") or key.startswith("@@"):
                raise BadRequest(f"grants: {key!r} is neither a user nor an @group")
            if not isinstance(prefixes, list) or not all(isinstance(p, str) for p in prefixes):
                raise BadRequest(f"grants.{key}: a list of prefixes, e.g. "
                                 f"[\"/datasets/x\", \"{READ_ONLY}/datasets/y\"]")
            table[key] = tuple(_grant(key, p, jobs) for p in prefixes)
        return cls(table)

    def of(self, owner: Owner) -> tuple[Grant, ...]:
        """The grants ``owner`` holds: its user's and its groups'; every grant for
        ``Owner(None)``."""
        if owner.user is None:
            return tuple(g for grants in self.table.values() for g in grants)
        keys = [owner.user, *(f"@{g}" for g in sorted(owner.groups))]
        return tuple(g for k in keys for g in self.table.get(k, ()))


def _grant(key: str, text: str, jobs_dir: str) -> Grant:
    writable = not text.startswith(READ_ONLY)
    raw = text if writable else text[len(READ_ONLY):]
    if not raw.startswith("/"):
        raise BadRequest(f"grants.{key}: {text!r} is not an absolute stager path")
    prefix = paths.normalize(raw)
    if paths.is_within(jobs_dir, prefix) or paths.is_within(prefix, jobs_dir):
        raise BadRequest(f"grants.{key}: {text!r} overlaps the jobs' directory {jobs_dir}: "
                         "a job would reach other jobs' directories")
    return Grant(prefix, writable)


@dataclass(frozen=True)
class Access:
    """A stager path a job reaches, how, and whether teardown removes it."""

    path: str
    writable: bool
    scratch: bool = False

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "writable": self.writable, "scratch": self.scratch}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Access:
        return cls(str(data["path"]), bool(data["writable"]), bool(data.get("scratch")))


def confine(directives: Iterable[Directive], job_dir: str, grants: Sequence[Grant],
            owner: Owner) -> list[Access]:
    """What the job reaches: its directory (read-write) first, then each directive's
    stager path outside it, with the mode its grant gives.  Raises :class:`NotGranted`
    naming the first directive that reaches further."""
    out = [Access(job_dir, True)]
    for d in directives:
        path = d.stager_path
        if paths.is_within(path, job_dir):
            continue
        where = f"line {d.line}: {d.kind} {d.src} {d.dst}"
        covering = [g for g in grants if paths.is_within(path, g.prefix)]
        if not covering:
            raise NotGranted(f"{where}: {path} is outside the job's directory {job_dir} "
                             f"and slurm.toml's [grants] give {owner} nothing there")
        writable = any(g.writable for g in covering)
        if d.writes and not writable:
            raise NotGranted(f"{where}: {path} is granted read-only to {owner} "
                             f"({', '.join(map(str, covering))}); {d.kind} writes there")
        if d.scratch and any(g.prefix == path for g in covering):
            raise NotGranted(f"{where}: --scratch names the granted prefix {path} itself; "
                             "a scratch copy goes below it (teardown removes it)")
        out.append(Access(path, writable, d.scratch))
    return merge(out)


def merge(accesses: Iterable[Access]) -> list[Access]:
    """``accesses`` without those another one already gives (same path or below it, no
    stronger mode); a scratch copy stays its own entry, teardown needs its path."""
    out: list[Access] = []
    for a in accesses:
        if not a.scratch and any(paths.is_within(a.path, b.path)
                                 and b.writable >= a.writable for b in out):
            continue
        out.append(a)
    return out


def prefixes(accesses: Iterable[Access], *, writable: bool | None = None) -> list[str]:
    """The paths of ``accesses`` (only the read-write or read-only ones if asked), none
    below another: a token's prefixes."""
    chosen = [a.path for a in accesses if writable is None or a.writable == writable]
    return [p for i, p in enumerate(chosen)
            if not any(paths.is_within(p, q) and (q != p or j < i)
                       for j, q in enumerate(chosen) if j != i)]
