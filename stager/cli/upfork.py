"""``stager up``'s servers forked from ``stager up`` itself, their code already imported.

A server started as ``python -m stager data …`` spends most of its start importing
(aiohttp, the config, the protocol, the data service: about 0.3 CPU seconds), and
``stager up`` has already imported half of that to build its own parser.  So ``up``
imports the data server's modules once and forks each server, which runs the same
``stager`` command line as the exec'd one would (``main(argv)``), in its own session,
its output in its log: a cluster of N data servers starts about 0.3 N CPU seconds
sooner.  The metadata server's modules are not imported first: they load numpy,
whose BLAS starts threads, and a fork keeps only the thread that forked.

``ps`` shows a forked server with ``stager up``'s command line; ``cluster.json``
names each server's pid and role, and its ``server.log`` is its own.

Only a parent with one thread forks (a second one could hold a lock the child
would wait on forever); :func:`fork_stager` answers ``None`` otherwise, and the
caller executes the command as before.  So it does where ``STAGER_UP_EXEC`` is set
(to anything but empty): for what hooks a server's own interpreter as it starts (a
``sitecustomize`` that looks at its ``sys.argv``, ``LD_PRELOAD``, a wrapper that
profiles a process from its first instruction), which a fork of ``up`` would bypass.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

# What `stager data` imports to run (stager/cli/servers.py run_data).
PRELOAD = ("stager.data.app", "stager.data.registration", "stager.web.authmw",
           "stager.web.server")
EXEC_ENV = "STAGER_UP_EXEC"  # set: `stager up` executes each server, forks none
_WAKEUP: list[int] = []     # the pipe `stager up` idles on: a forked child closes it


class Forked:
    """A forked server: the part of :class:`subprocess.Popen` that ``stager up`` and
    its supervisor use (``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``,
    ``kill``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:   # reaped elsewhere: gone, its status unknown
                self.returncode = 0         # (what subprocess.Popen says then)
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"stager (pid {self.pid})", timeout or 0.0)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def wake_on_signals() -> Callable[[float], None]:
    """``idle(seconds)``: a sleep that a signal ends at once (SIGTERM, SIGINT, and a
    server's exit: SIGCHLD), so that ``stager up`` stops, and restarts a killed
    server, without first finishing its poll interval."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    _WAKEUP[:] = [r, w]
    signal.set_wakeup_fd(w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)   # a handler: it wakes

    def idle(seconds: float) -> None:
        select.select([r], [], [], seconds)
        try:
            os.read(r, 4096)
        except BlockingIOError:
            pass

    return idle


def preload() -> None:
    """Import the data server's modules here, once, so every fork has them."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)


def fork_stager(argv: list[str], log: Path, *, data: bool = False) -> Forked | None:
    """Run ``stager ARGV`` in a forked child writing to ``log`` (appended), in a new
    session that gets SIGTERM when this process dies; ``None`` where this process
    cannot fork safely (more than one thread).  ``data``: it is a data server, whose
    modules are imported here first (:func:`preload`; the metadata server is forked
    before them, and starts while they load)."""
    if threading.active_count() > 1 or os.environ.get(EXEC_ENV):
        return None
    if data:
        preload()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return Forked(pid)
    code = 1
    try:
        code = _child(argv, log)
    except SystemExit as exc:       # argparse's errors, --help
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)      # never the parent's atexit handlers, nor its `finally`s


def _child(argv: list[str], log: Path) -> int:
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # `stager up`'s own handlers and wake-up pipe are not the server's
    signal.set_wakeup_fd(-1)
    for fd in _WAKEUP:
        os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # the child sets its logging from its own flags, as an exec'd one would
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    from .main import main

    return main(argv)
