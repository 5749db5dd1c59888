"""``stager up`` forks its servers from itself (stager/cli/upfork.py): the forked
child runs the same command as ``python -m stager …`` would, with its output in its
log and its own exit code; the parent's idle loop wakes at once on a child's exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from stager.cli.upfork import fork_stager
from stager.testing import ProcessCluster


def run_script(code: str) -> str:
    """``code`` in a fresh single-threaded interpreter (pytest's may hold threads)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_forked_stager_command_logs_and_exits_as_an_execd_one(tmp_path: Path) -> None:
    out = run_script(f"""
        import signal, time
        from pathlib import Path
        from stager.cli.upfork import fork_stager, wake_on_signals
        idle = wake_on_signals()
        signal.signal(signal.SIGTERM, lambda *a: None)   # as stager up's own handler
        ok = fork_stager(["data", "--help"], Path("{tmp_path}/ok.log"), data=True)
        start = time.monotonic()
        idle(30)                                         # woken by the child's exit
        woke = time.monotonic() - start
        bad = fork_stager(["no-such-command"], Path("{tmp_path}/bad.log"))
        print(ok.wait(30), bad.wait(30), woke < 10)
        sleeper = fork_stager(["--meta", "http://127.0.0.1:9", "data", "--root",
                               "{tmp_path}/d", "--port", "0"], Path("{tmp_path}/d.log"),
                              data=True)
        log, deadline = Path("{tmp_path}/d.log"), time.monotonic() + 30
        while time.monotonic() < deadline and not (
                log.exists() and "unreachable" in log.read_text()):
            time.sleep(0.05)                             # its first try logged (slow when loaded)
        sleeper.send_signal(signal.SIGTERM)              # the child's default handling
        print(sleeper.wait(30) in (0, -signal.SIGTERM))
        """)
    assert out.split() == ["0", "2", "True", "True"]
    assert "usage: stager data" in (tmp_path / "ok.log").read_text()
    assert "invalid choice: 'no-such-command'" in (tmp_path / "bad.log").read_text()
    assert "metadata server http://127.0.0.1:9 unreachable" in (tmp_path / "d.log").read_text()


def test_a_parent_with_a_second_thread_does_not_fork(tmp_path: Path) -> None:
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert fork_stager(["--help"], tmp_path / "log") is None
    finally:
        stop.set()
        other.join()


def test_stager_up_forks_its_data_servers_and_restarts_a_killed_one(tmp_path: Path) -> None:
    with ProcessCluster(tmp_path / "c", 2, restart=True) as c:
        up = Path(f"/proc/{c.proc.pid}/cmdline").read_bytes()    # type: ignore[union-attr]
        assert Path(f"/proc/{c.data_pid(0)}/cmdline").read_bytes() == up
        old = c.data_pid(1)
        c.kill_data(1)
        assert c.wait_restarted("data", 1, old, timeout=20) < 20
        c.reload()
        assert Path(f"/proc/{c.data_pid(1)}/cmdline").read_bytes() == up


def test_stager_up_exec_runs_each_server_as_its_own_interpreter(tmp_path: Path) -> None:
    """``STAGER_UP_EXEC``: for hooks that start with a server's interpreter (a
    ``sitecustomize``, ``LD_PRELOAD``), each server is ``python -m stager …`` again."""
    with ProcessCluster(tmp_path / "c", 1, env={"STAGER_UP_EXEC": "1"}) as c:
        up = Path(f"/proc/{c.proc.pid}/cmdline").read_bytes()    # type: ignore[union-attr]
        for pid in (c.data_pid(0), c.meta_pid()):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert argv != up.split(b"\0") and argv[1:3] == [b"-m", b"stager"], argv
