"""``stager slurm HOOK …``: the hooks of Slurm's ``burst_buffer/lua`` plugin.

``deploy/slurm/burst_buffer.lua`` runs one of these per hook, with the
arguments Slurm gave the hook.  The exit status is the hook's (0: success);
the output is the message Slurm shows: sbatch's error for a rejected job, the
reason of a held one.  The work is :mod:`stager.stage.slurm`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from ..errors import StagerError

if TYPE_CHECKING:
    from ..stage.slurmjob import SlurmSettings

# stager.stage.slurmjob's, repeated for the help text: every `stager` command builds
# this parser, and the hooks' code (the staging code, the client) loads only for a hook.
DEFAULT_SETTINGS = "/etc/stager/slurm.toml"


def _hooks() -> ModuleType:
    from ..stage import slurm

    return slurm


# hook -> (its arguments as Slurm passes them, "?": not every Slurm does, what it does
# with the settings and them)
HOOKS: dict[str, tuple[tuple[str, ...], Callable[..., str]]] = {
    "job_process": (("script", "uid?", "gid?"),
                    lambda s, a: _hooks().job_process(s, a.script, a.uid, a.gid)),
    "setup": (("job_id", "uid", "gid", "pool", "size", "script"),
              lambda s, a: _hooks().setup(s, a.job_id, a.uid, a.gid, a.script)),
    "data_in": (("job_id", "script"), lambda s, a: _hooks().data_in(s, a.job_id, a.script)),
    "paths": (("job_id", "script", "path_file"),
              lambda s, a: _hooks().paths_file(s, a.job_id, a.path_file)),
    # pre_run, post_run: nothing to do (burst_buffer.lua no longer runs them; an older
    # copy of it does)
    "pre_run": (("job_id", "script"), lambda s, a: ""),
    "post_run": (("job_id", "script"), lambda s, a: ""),
    "data_out": (("job_id", "script"), lambda s, a: _hooks().data_out(s, a.job_id, a.script)),
    "teardown": (("job_id", "script", "hurry"), lambda s, a: _teardown(s, a.job_id)),
    "status": ((), lambda s, a: _hooks().status(s)),
    "pools": ((), lambda s, a: _hooks().pools(s)),
}


def _teardown(settings: SlurmSettings, job_id: str) -> str:
    """One job's teardowns one at a time.  Slurm may run two at once: the one a failed
    data_in starts and the one its scancel queues (burst_buffer.lua runs teardown in
    a session of its own, so the first outlives the kill); at the same time, each
    would rewrite the job's record under the other (a token lost to revocation) and
    find it gone at its end."""
    with _locked(Path(settings.state_dir, f"{job_id}.teardown-lock")):
        return _hooks().teardown(settings, job_id)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on ``path`` (root's, 0600), removed when done (a teardown
    that waited runs after, and finds nothing left to do: teardown is idempotent)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
        path.unlink(missing_ok=True)
    finally:
        os.close(fd)


def cmd_hook(args: argparse.Namespace) -> int:
    try:
        settings = _hooks().SlurmSettings.load(args.config)
        if args.directive:
            settings = dataclasses.replace(settings, directive=args.directive)
        message = HOOKS[args.hook][1](settings, args)
    except (StagerError, OSError, ValueError) as exc:
        print(getattr(exc, "message", None) or str(exc) or type(exc).__name__)
        return 1
    if message:
        print(message)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("slurm", help="Slurm burst-buffer hooks (deploy/slurm/burst_buffer.lua)",
                       description=__doc__.split("\n\n")[1] if __doc__ else None)
    hook_sub = p.add_subparsers(dest="hook", metavar="HOOK", required=True)
    for name, (params, _) in HOOKS.items():
        h = hook_sub.add_parser(name, help=f"slurm_bb_{name}")
        h.add_argument("--config", metavar="TOML",
                       help=f"the hooks' settings (default: {DEFAULT_SETTINGS})")
        h.add_argument("--directive", help="the directive word (burst_buffer.conf's "
                                           "Directive=; default: the settings', STAGER)")
        for param in params:
            if param.endswith("?"):
                h.add_argument(param[:-1], nargs="?")
            else:
                h.add_argument(param)
        if name == "status":
            h.add_argument("words", nargs="*", help="scontrol show bbstat's arguments")
        h.set_defaults(func=cmd_hook)

