"""Running a mount: in the foreground (the FUSE loop itself), or as a background
daemon that the caller waits for; and unmounting.

The foreground process runs one event loop (uvloop when present) holding both
the FUSE session and the :class:`~stager.client.AsyncClient`.  SIGTERM and
SIGINT end the loop and unmount; ``fusermount3 -u`` (``stager umount``) ends
it from outside.  Either way, versions still being written are abandoned.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..client.cluster import Cluster
from ..errors import NotADirectory, StagerError
from .options import MountOptions, resolve

log = logging.getLogger("stager.mount")
FSTYPE = "fuse.stager"
_OCTAL = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class MountEntry:
    """One line of ``/proc/self/mountinfo``."""

    device: str          # "major:minor"
    mountpoint: str
    fstype: str
    source: str


def mounts() -> list[MountEntry]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        point = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), fields[4])   # "\040" is " "
        out.append(MountEntry(fields[2], point, fields[sep + 1], fields[sep + 2]))
    return out


def mount_entry(mountpoint: str) -> MountEntry | None:
    """The mount on top at ``mountpoint``, if any (without touching the mount itself)."""
    point = resolve(mountpoint)
    found = [m for m in mounts() if m.mountpoint == point]
    return found[-1] if found else None


def tune_readahead(device: str, nbytes: int) -> bool:
    """Let the kernel read ``nbytes`` ahead on this mount (its default is 128 KiB,
    which would cut every sequential read into 128 KiB requests).  Needs root."""
    knob = Path("/sys/class/bdi") / device / "read_ahead_kb"
    try:
        knob.write_text(str(max(128, nbytes // 1024)))
        return True
    except OSError as exc:
        log.info("cannot set %s (%s): the kernel reads ahead its default", knob, exc)
        return False


async def serve(options: MountOptions, cluster: Cluster) -> None:
    """Mount, answer requests until unmounted or signalled, then clean up."""
    import pyfuse3
    import pyfuse3.asyncio

    from ..client import AsyncClient
    from .fs import StagerFS

    pyfuse3.asyncio.enable()
    async with AsyncClient(cluster=cluster) as client:
        root = await client.stat(options.path, cached=False)
        if not root.is_dir:
            raise NotADirectory(f"{options.path} is not a directory", path=options.path)
        fs = StagerFS(client, root, options)
        fuse_options = {"fsname=stager", "subtype=stager", "default_permissions", "noatime"}
        if options.read_only:
            fuse_options.add("ro")
        point = options.abs_mountpoint
        fs.on_init = lambda: _after_init(point, options)
        pyfuse3.init(fs, point, fuse_options)
        try:
            loop = asyncio.get_running_loop()
            stopping: set[asyncio.Task[None]] = set()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, lambda: stopping.add(loop.create_task(_stop(point))))
            log.info("mounted %s%s at %s", cluster.meta_url, root.path, point)
            await pyfuse3.main(min_tasks=2)
        finally:
            await fs.shutdown()
            pyfuse3.close(unmount=True)
            log.info("unmounted %s", point)


async def _stop(point: str) -> None:
    """A signal: unmount as ``stager umount`` would, so the session ends the way it
    always ends; if the mount is busy, end the session here (``close`` detaches it)."""
    import pyfuse3

    log.info("signalled: unmounting %s", point)
    if not await asyncio.to_thread(_unmount_quietly, point):
        pyfuse3.terminate()


def _unmount_quietly(point: str) -> bool:
    tool = shutil.which("fusermount3")
    cmd = [tool, "-u", point] if tool else ["umount", point]
    return subprocess.run(cmd, capture_output=True, check=False).returncode == 0


def _after_init(point: str, options: MountOptions) -> None:
    entry = mount_entry(point)
    if entry is not None:
        tune_readahead(entry.device, options.kernel_readahead)


def run_foreground(options: MountOptions, cluster: Cluster, pid_file: str | None = None
                   ) -> int:
    if pid_file:
        Path(pid_file).write_text(f"{os.getpid()}\n")
    try:
        try:
            import uvloop
        except ImportError:
            asyncio.run(serve(options, cluster))
        else:
            uvloop.run(serve(options, cluster))
    finally:
        if pid_file:
            Path(pid_file).unlink(missing_ok=True)
    return 0


def check_mountpoint(mountpoint: str) -> None:
    try:
        mode = os.stat(mountpoint).st_mode
    except OSError as exc:      # ENOTCONN: a mount whose daemon died
        hint = f"; try `stager umount {mountpoint}`" if mount_entry(mountpoint) else ""
        raise StagerError(f"mount point {mountpoint}: {exc.strerror}{hint}") from exc
    if not stat.S_ISDIR(mode):
        raise NotADirectory(f"mount point {mountpoint} is not a directory")
    entry = mount_entry(mountpoint)
    if entry is not None:
        hint = f"`stager umount {mountpoint}` first" if entry.fstype == FSTYPE else "unmount it"
        raise StagerError(f"{mountpoint} is already a mount point ({entry.fstype}); {hint}")


def spawn(argv: Sequence[str], mountpoint: str, log_file: str, timeout: float = 30.0) -> int:
    """Start ``stager … mount --foreground`` detached; return its pid once the mount
    answers, or raise with the end of its log when it fails."""
    with open(log_file, "ab") as logf:
        proc = subprocess.Popen([sys.executable, "-m", "stager", *argv],
                                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                start_new_session=True, cwd="/")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entry = mount_entry(mountpoint)
        if entry is not None and entry.fstype == FSTYPE:
            os.stat(mountpoint)        # answered by the new mount: it is serving
            return proc.pid
        if proc.poll() is not None:
            raise StagerError(f"mount failed (exit {proc.returncode}):\n{_tail(log_file)}")
        time.sleep(0.02)
    proc.terminate()
    raise StagerError(f"mount did not answer within {timeout:.0f}s:\n{_tail(log_file)}")


def _tail(path: str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def unmount(mountpoint: str, *, lazy: bool = False, timeout: float = 10.0) -> None:
    """Unmount a stager mount; its daemon then finishes and exits."""
    entry = mount_entry(mountpoint)
    if entry is None:
        raise StagerError(f"{mountpoint} is not mounted")
    if entry.fstype != FSTYPE:
        raise StagerError(f"{mountpoint} is a {entry.fstype} mount, not a stager mount")
    tool = shutil.which("fusermount3")
    cmd = [tool, "-u"] if tool else ["umount"]
    if lazy:
        cmd.append("-z" if tool else "-l")
    done = subprocess.run([*cmd, resolve(mountpoint)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise StagerError(f"unmounting {mountpoint} failed: {done.stderr.strip()}")
    deadline = time.monotonic() + timeout
    while mount_entry(mountpoint) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
