"""Real FUSE mounts for tests and benchmarks: ``stager mount`` as a subprocess.

:class:`Mounted` runs the CLI exactly as a user would (in the background by
default, returning once the mount answers) and always cleans up: ``stager
umount``, then a lazy unmount and SIGKILL if the daemon does not go.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..mount.runner import mount_entry


def fuse_unavailable() -> str | None:
    """Why FUSE mounts cannot run here, or ``None`` when they can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    try:
        import pyfuse3  # noqa: F401
    except ImportError:
        return "pyfuse3 is not installed (pip install -e '.[fuse]')"
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return "not root and no fusermount3"
    return None


class Mounted:
    """One ``stager mount`` of ``meta_url`` + ``path`` at ``mountpoint``."""

    def __init__(self, meta_url: str, mountpoint: str | os.PathLike[str], *, path: str = "/",
                 args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        self.meta_url = meta_url
        self.mountpoint = Path(mountpoint)
        self.path = path
        self.args = args
        self.env = {**os.environ, **(env or {})}
        self.pid_file = self.mountpoint.with_name(self.mountpoint.name + ".pid")
        self.log_file = self.mountpoint.with_name(self.mountpoint.name + ".log")
        self.pid: int | None = None

    def cli(self, *argv: str, check: bool = True, timeout: float = 60
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "stager", "--meta", self.meta_url, *argv],
                              capture_output=True, text=True, env=self.env, check=check,
                              timeout=timeout)

    def start(self) -> Mounted:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        done = self.cli("mount", str(self.mountpoint), "--path", self.path, "--pid-file",
                        str(self.pid_file), "--log", str(self.log_file), *self.args,
                        check=False)
        if done.returncode != 0:
            raise RuntimeError(f"stager mount failed: {done.stderr}")
        self.pid = int(self.pid_file.read_text())
        return self

    def __enter__(self) -> Mounted:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def alive(self) -> bool:
        if self.pid is None:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        # A zombie is gone for our purposes (its parent, `stager mount`, exited).
        stat = Path(f"/proc/{self.pid}/stat")
        return not stat.exists() or stat.read_text().split(") ")[-1][:1] != "Z"

    def wait_exit(self, timeout: float = 15) -> bool:
        deadline = time.monotonic() + timeout
        while self.alive and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self.alive

    def stop(self) -> None:
        """Unmount and make sure the daemon is gone, whatever state it is in."""
        if mount_entry(str(self.mountpoint)) is not None:
            self.cli("umount", str(self.mountpoint), check=False)
        if not self.wait_exit(15):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)],
                           capture_output=True, check=False)
            if self.pid is not None and self.alive:
                os.kill(self.pid, signal.SIGKILL)
            self.wait_exit(5)
        self.pid = None

    def stats(self) -> dict[str, object]:
        import json

        return dict(json.loads(os.getxattr(self.mountpoint, "user.stager.stats")))

    def log(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except OSError:
            return ""
