"""``stager up --restart``: a server that exits (a crash, ``kill -9``) is started again.

The new process gets the same command line, root and port as the one that
died, so clients, data servers and ``cluster.json`` keep their URLs; nothing
needs a manual step.  A data server finds its chunks and its target id in its
root; the metadata server finds its SQLite store there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar
from urllib.parse import urlsplit

RESTART_TIMEOUT = 30.0


class Restartable(Protocol):
    role: str
    root: Path
    url: str
    node: str
    argv: list[str]
    log: Path | None


def with_port(argv: list[str], port: int) -> list[str]:
    """``argv`` with the value after ``--port`` set to ``port``."""
    out = list(argv)
    if "--port" in out:
        out[out.index("--port") + 1] = str(port)
    else:
        out += ["--port", str(port)]
    return out


S = TypeVar("S", bound=Restartable)


def restart(server: S, spawn: Callable[[str, Path, list[str], Path], S],
            wait_ready: Callable[[S, float], None]) -> S:
    """Start ``server`` again on the port it had; returns the new one once it listens."""
    port = urlsplit(server.url).port
    argv = with_port(server.argv, port) if port else server.argv
    new = spawn(server.role, server.root, argv, server.log or server.root / "server.log")
    new.node = server.node
    wait_ready(new, time.monotonic() + RESTART_TIMEOUT)
    return new
