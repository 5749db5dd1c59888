"""``#STAGER`` directives in a batch script: what a job asks to be staged in and out.

::

    #!/bin/sh
    #SBATCH --nodes=3
    #STAGER stage_in  https://host/imagenet  /jobs/$SLURM_JOB_ID/in  --include '*.tar'
    #STAGER stage_out /jobs/$SLURM_JOB_ID/out file:///project/results
    #STAGER stage_in  s3://bucket/vocab  /datasets/team-a/tmp-$SLURM_JOB_ID  --scratch
    #STAGER attach    s3://bucket/laion  /jobs/$SLURM_JOB_ID/laion  --refresh 3600
    #STAGER pool=stager capacity=200GiB

Read the way Slurm's ``burst_buffer/lua`` plugin reads them, so that both agree
on which lines are directives: only the script's leading comment block counts
(reading stops at the first line that is not blank and does not start with
``#``), and a line ending in ``\\`` continues on the next directive line.  The
directive word is configurable (``Directive=`` of ``burst_buffer.conf``).

A stager path may be relative: it is then below the job's directory
(``/jobs/<id>``).  ``$SLURM_JOB_ID`` (or ``${SLURM_JOB_ID}``) is the only
variable; anything else with a ``$`` is an error, so that a typo never stages
into a path the user did not mean.  ``--scratch`` marks a ``stage_in`` copy outside
the job's directory as the job's own: teardown removes it (the job's directory goes
anyway).  Where a job may reach at all is :mod:`stager.stage.grants`' question.

``attach`` makes its destination a cached view of the source (``stager attach``)
instead of a copy: the hooks attach and warm it before the job starts and detach it
at teardown.  Its source is read by the stager servers, not as the job's owner, so a
``file://`` (or ``memory://``) source is refused: it would be read with the servers'
rights; ``stage_in`` copies a local source as its owner.  ``capacity=SIZE`` becomes
the quota of the job's directory.  Slurm reads that word itself, for the job's
share of a burst-buffer pool, and wants the pool named with it: ``pool=stager``
(whose size is the cluster's free bytes, :func:`stager.stage.slurm.pools`).
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass

from ..config import parse_size
from ..errors import BadRequest
from ..protocol import paths
from ..protocol.cache import AttachRequest

__all__ = ["Directive", "DirectiveError", "parse_directives"]

KINDS = ("stage_in", "stage_out", "attach", "capacity=SIZE")
SERVER_READ = ("file", "memory")     # attach: sources only a server's own rights could read
_VAR = re.compile(r"\$(\{SLURM_JOB_ID\}|SLURM_JOB_ID\b)")


class DirectiveError(BadRequest):
    """A malformed directive; the message names its line."""


@dataclass(frozen=True)
class Directive:
    kind: str                   # "stage_in", "stage_out", "attach" or "capacity"
    src: str                    # stage_in, attach: any fsspec URL; stage_out: a stager path
    dst: str                    # stage_in, attach: a stager path; stage_out: any fsspec URL;
                                # capacity: the job's directory
    line: int                   # where it starts in the script (1-based)
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    scratch: bool = False       # stage_in: teardown removes the copy
    refresh: float | None = None    # attach: seconds between listings of the source
    capacity: int | None = None     # capacity: bytes, the job directory's quota

    @property
    def stager_path(self) -> str:
        """The stager side: where data lands (stage_in, attach), comes from (stage_out),
        or is counted (capacity)."""
        return self.src if self.kind == "stage_out" else self.dst

    @property
    def writes(self) -> bool:
        """Does the directive write its stager path (and so need it read-write)?"""
        return self.kind in ("stage_in", "attach")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:   # type: ignore[override]
        raise DirectiveError(message)


def _arguments() -> _Parser:
    p = _Parser(prog="stage_in", add_help=False, exit_on_error=False)
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--include", action="append", default=[])
    p.add_argument("--exclude", action="append", default=[])
    p.add_argument("--scratch", action="store_true")
    p.add_argument("--refresh", type=float)
    return p


def directive_lines(script: str, word: str = "STAGER") -> list[tuple[int, str]]:
    """``(line number, text after the directive word)`` of each directive, continuation
    lines joined."""
    out: list[tuple[int, str]] = []
    tag = "#" + word
    continued = False
    for number, raw in enumerate(script.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if not line.startswith("#"):
            break                           # the first command ends the directives
        if not line.startswith(tag) or (line[len(tag):len(tag) + 1] not in ("", " ", "\t")):
            continued = False
            continue
        text = line[len(tag):].strip()
        more = text.endswith("\\")
        text = text[:-1].rstrip() if more else text
        if continued:
            out[-1] = (out[-1][0], f"{out[-1][1]} {text}")
        else:
            out.append((number, text))
        continued = more
    return out


def parse_directives(script: str, *, word: str = "STAGER", job_id: int | str | None = None,
                     jobs_dir: str = "/jobs") -> list[Directive]:
    """Every directive of ``script``, checked; ``$SLURM_JOB_ID`` becomes ``job_id``
    (``None``: a placeholder, for checking before the job has one).  Raises
    :class:`DirectiveError` naming the first bad line."""
    job = "0" if job_id is None else str(job_id)
    job_dir = paths.normalize(f"{jobs_dir}/{job}")
    out: list[Directive] = []
    for number, text in directive_lines(script, word):
        where = f"line {number}: #{word} {text}"
        try:
            out.append(_one(text, number, job, job_dir))
            if [d.kind for d in out].count("capacity") > 1:
                raise DirectiveError("a second capacity=: a job has one")
        except DirectiveError as exc:
            raise DirectiveError(f"{where}: {exc.message}") from None
        except ValueError as exc:           # shlex: an unclosed quote
            raise DirectiveError(f"{where}: {exc}") from None
    return out


def _one(text: str, number: int, job: str, job_dir: str) -> Directive:
    words = shlex.split(text)
    if not words:
        raise DirectiveError(f"empty directive: expected one of {', '.join(KINDS)}")
    kind, rest = words[0], words[1:]
    if "=" in kind:
        return _capacity(words, number, job_dir)
    if kind not in KINDS:
        raise DirectiveError(f"unknown directive {kind!r}: expected one of {', '.join(KINDS)}")
    try:
        args, extra = _arguments().parse_known_args([_expand(w, job) for w in rest])
    except argparse.ArgumentError as exc:
        raise DirectiveError(str(exc)) from None
    if extra:
        raise DirectiveError(f"unexpected {' '.join(extra)!r}: {kind} SRC DST "
                             f"{_FLAGS[kind]}".rstrip())
    used = {"--include": args.include, "--exclude": args.exclude, "--scratch": args.scratch,
            "--refresh": args.refresh is not None}
    if any(given and flag not in _FLAGS[kind] for flag, given in used.items()):
        refused = "/".join(flag for flag in used if flag not in _FLAGS[kind])
        raise DirectiveError(f"{kind} takes no {refused}: {kind} SRC DST "
                             f"{_FLAGS[kind]}".rstrip())
    if kind == "stage_out":
        src, dst = _stager_path(args.src, job_dir), args.dst
        if _is_stager(dst):
            raise DirectiveError(f"stage_out's destination {dst!r} must be a URL outside "
                                 "stager (file://, s3://, …)")
    else:
        src, dst = args.src, _stager_path(args.dst, job_dir)
        if _is_stager(src):
            raise DirectiveError(f"{kind}'s source {src!r} must be a URL outside stager")
    if kind == "attach":
        _attach_source(src, args.refresh)
    return Directive(kind, src, dst, number, tuple(args.include), tuple(args.exclude),
                     args.scratch, args.refresh)


_FLAGS = {"stage_in": "[--include GLOB] [--exclude GLOB] [--scratch]",
          "stage_out": "",
          "attach": "[--include GLOB] [--exclude GLOB] [--refresh SECONDS]"}


def _attach_source(src: str, refresh: float | None) -> None:
    """An attach's source: one the servers may read (not with their own rights)."""
    protocol = src.partition("://")[0]
    if protocol in SERVER_READ:
        raise DirectiveError(f"attach's source {src!r}: the stager servers read an "
                             f"attached source with their own rights, so {protocol}:// is "
                             "refused; stage_in copies it as the job's owner")
    try:                                        # the server's own checks, at sbatch
        AttachRequest.from_json({"source": src, "refresh": refresh})
    except BadRequest as exc:
        raise DirectiveError(f"attach: {exc.message}") from None


def _capacity(words: list[str], number: int, job_dir: str) -> Directive:
    """``capacity=SIZE`` (and Slurm's ``pool=NAME``, which stager has one of): the quota
    of the job's directory."""
    pairs = dict(w.partition("=")[::2] for w in words)
    unknown = [w for w in words if w.partition("=")[0] not in ("capacity", "pool")
               or "=" not in w]
    if unknown or len(pairs) != len(words):
        raise DirectiveError(f"unexpected {' '.join(unknown or words)!r}: capacity=SIZE "
                             "[pool=NAME]")
    if "capacity" not in pairs:
        raise DirectiveError("pool=NAME without capacity=SIZE")
    size = pairs["capacity"]
    try:
        nbytes = parse_size(size)
    except BadRequest:
        nbytes = 0
    if nbytes <= 0:
        raise DirectiveError(f"capacity={size}: a size above 0 (e.g. capacity=200GiB)")
    return Directive("capacity", "", job_dir, number, capacity=nbytes)


def _expand(word: str, job: str) -> str:
    word = _VAR.sub(job, word)
    if "$" in word:
        raise DirectiveError(f"{word!r}: only $SLURM_JOB_ID is expanded")
    return word


def _is_stager(url: str) -> bool:
    return "://" not in url or url.startswith("stager://")


def _stager_path(path: str, job_dir: str) -> str:
    if path.startswith("stager://"):
        raise DirectiveError(f"{path!r}: name the stager side by its path (/jobs/…), "
                             "the cluster is the one configured for Slurm")
    if "://" in path:
        raise DirectiveError(f"{path!r} must be a stager path")
    try:
        return paths.normalize(path if path.startswith("/") else f"{job_dir}/{path}")
    except BadRequest as exc:
        raise DirectiveError(exc.message) from None
