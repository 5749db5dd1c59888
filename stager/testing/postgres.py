"""A throwaway PostgreSQL server for tests: ``initdb`` in a temporary directory,
``pg_ctl start`` on a free port of 127.0.0.1, removed when stopped.

PostgreSQL refuses to run as root, so under root the server runs as the
``postgres`` system user (Debian's package creates it) and owns the temporary
directory.  Authentication is ``trust`` on loopback: the server is reachable
only from this machine and lives only as long as the tests.

Where PostgreSQL is not installed, or cannot start here, :func:`start_postgres`
raises :class:`PostgresUnavailable` with the reason, so a fixture can skip
saying why.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

SUPERUSER = "postgres"


class PostgresUnavailable(RuntimeError):
    """PostgreSQL is not installed here, or would not start (the reason says which)."""


def find_bindir() -> Path:
    """The directory of ``initdb`` and ``pg_ctl``: Debian's newest under
    /usr/lib/postgresql, else wherever PATH has them."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    raise PostgresUnavailable("PostgreSQL is not installed (no initdb under "
                              "/usr/lib/postgresql/*/bin nor on PATH): apt-get install postgresql")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One PostgreSQL cluster in ``base`` (a temporary directory), serving ``port``."""

    def __init__(self, bindir: Path, base: Path, port: int, user: str | None) -> None:
        self.bindir = bindir
        self.base = base
        self.data = base / "data"
        self.socket_dir = base / "run"
        self.log = base / "postgres.log"
        self.port = port
        self.user = user             # the system user the server runs as (None: ours)

    @property
    def url(self) -> str:
        """The URL of the ``postgres`` database (the superuser's)."""
        return self.url_of("postgres")

    def url_of(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, check: bool = True, timeout: float = 120
             ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bindir / args[0]), *args[1:]], user=self.user,
                              capture_output=True, text=True, check=check, timeout=timeout,
                              cwd=self.base)

    def initdb(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
                  "--encoding=UTF8", "--locale=C.UTF-8", "--no-instructions")

    def start(self) -> None:
        """Start (or start again after :meth:`stop`) on the same port; waits until it
        accepts connections."""
        options = (f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 "
                   "-c max_connections=200 -c shared_buffers=32MB")
        done = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options,
                         "-w", "-t", "60", "start", check=False)
        if done.returncode != 0:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise PostgresUnavailable(f"pg_ctl start failed ({done.returncode}): "
                                      f"{done.stderr.strip()} {tail}")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (its data stays: :meth:`start` brings it back)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def sql(self, statement: str, database: str = "postgres") -> str:
        """Run one statement through ``psql`` (as the superuser); its output."""
        done = self._run("psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                         "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER,
                         "-d", database, "-c", statement, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"psql failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def create_database(self, name: str | None = None) -> str:
        """A fresh, empty database; its URL."""
        name = name or f"t_{uuid.uuid4().hex[:12]}"
        self.sql(f'CREATE DATABASE "{name}"')
        return self.url_of(name)

    def destroy(self) -> None:
        """Stop the server and remove its directory."""
        self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


def _server_user() -> str | None:
    """Who the server runs as: ourselves, unless we are root (PostgreSQL refuses)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SUPERUSER)
    except KeyError:
        raise PostgresUnavailable("running as root and there is no 'postgres' system user "
                                  "to run PostgreSQL as (PostgreSQL refuses root)") from None
    return SUPERUSER


def start_postgres() -> PostgresServer:
    """A fresh PostgreSQL on a free port of 127.0.0.1; :meth:`PostgresServer.destroy`
    it at the end.  Raises :class:`PostgresUnavailable` saying why when it cannot."""
    bindir = find_bindir()
    user = _server_user()
    base = Path(tempfile.mkdtemp(prefix="stager-pg-"))
    try:
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(base, entry.pw_uid, entry.pw_gid)
        (base / "run").mkdir()
        if user is not None:
            os.chown(base / "run", entry.pw_uid, entry.pw_gid)
        server = PostgresServer(bindir, base, _free_port(), user)
        try:
            server.initdb()
        except subprocess.CalledProcessError as exc:
            raise PostgresUnavailable(f"initdb failed: {exc.stderr.strip()}") from None
        for attempt in range(3):          # the free port may be taken meanwhile
            try:
                server.start()
                return server
            except PostgresUnavailable:
                if attempt == 2:
                    raise
                server.port = _free_port()
        raise AssertionError("unreachable")
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
