"""``stager mount MOUNTPOINT`` and ``stager umount MOUNTPOINT``."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from typing import TYPE_CHECKING

from ..config import Config, parse_size
from ..protocol import paths
from .main import meta_url

if TYPE_CHECKING:   # the mount and the client load when a command mounts
    from ..mount import MountOptions


def options_of(args: argparse.Namespace, config: Config) -> MountOptions:
    from ..mount import MountOptions

    return MountOptions(
        mountpoint=args.mountpoint, path=paths.normalize(args.path),
        read_only=args.read_only, attr_timeout=args.attr_timeout,
        entry_timeout=args.attr_timeout,
        readahead_chunks=args.readahead_chunks or config.readahead_chunks,
        kernel_readahead=parse_size(args.kernel_readahead),
        list_page_size=config.list_page_size)


def default_log(mountpoint: str) -> str:
    from ..mount.options import resolve

    tag = hashlib.sha1(resolve(mountpoint).encode()).hexdigest()[:10]
    return os.path.join(tempfile.gettempdir(), f"stager-mount-{os.getuid()}-{tag}.log")


def _daemon_argv(args: argparse.Namespace) -> list[str]:
    """The same mount, as the command line of the foreground daemon."""
    from ..mount.options import resolve

    argv = ["--meta", meta_url(args), "--log-level", args.log_level, "mount",
            resolve(args.mountpoint), "--path", args.path, "--foreground",
            "--attr-timeout", str(args.attr_timeout),
            "--kernel-readahead", str(args.kernel_readahead)]
    if args.read_only:
        argv.append("--read-only")
    if args.readahead_chunks:
        argv += ["--readahead-chunks", str(args.readahead_chunks)]
    if args.pid_file:
        argv += ["--pid-file", os.path.abspath(args.pid_file)]
    return argv


def cmd_mount(args: argparse.Namespace) -> int:
    from ..client.cluster import Cluster
    from ..mount import run_foreground, spawn
    from ..mount.runner import check_mountpoint

    cluster = Cluster.resolve(meta_url(args))
    options = options_of(args, cluster.config)
    check_mountpoint(args.mountpoint)
    if args.foreground:
        return run_foreground(options, cluster, args.pid_file)
    log_file = args.log or default_log(args.mountpoint)
    pid = spawn(_daemon_argv(args), args.mountpoint, log_file)
    print(f"mounted {meta_url(args)}{options.path} at {options.abs_mountpoint} "
          f"(pid {pid}, log {log_file})", file=sys.stderr)
    return 0


def cmd_umount(args: argparse.Namespace) -> int:
    from ..mount import unmount

    unmount(args.mountpoint, lazy=args.lazy)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("mount", help="mount the namespace as a FUSE file system")
    p.add_argument("mountpoint")
    p.add_argument("--path", default="/", help="namespace directory to mount (default /)")
    p.add_argument("--read-only", action="store_true", help="refuse every change (EROFS)")
    p.add_argument("--foreground", action="store_true",
                   help="serve in this process until unmounted or signalled")
    p.add_argument("--attr-timeout", type=float, default=1.0, metavar="SECONDS",
                   help="how long the kernel may reuse names and attributes (default 1)")
    p.add_argument("--readahead-chunks", type=int, default=0, metavar="N",
                   help="chunks fetched ahead of a sequential reader "
                        "(default: readahead_chunks of the configuration)")
    p.add_argument("--kernel-readahead", default="4MiB", metavar="SIZE",
                   help="how far the kernel reads ahead on this mount (default 4MiB, one "
                        "default chunk; at least 1MiB for 1 MiB requests; needs root)")
    p.add_argument("--log", metavar="FILE", help="the background daemon's log")
    p.add_argument("--pid-file", metavar="FILE", help="write the daemon's pid here")
    p.set_defaults(func=cmd_mount)

    p = sub.add_parser("umount", help="unmount a stager mount")
    p.add_argument("mountpoint")
    p.add_argument("-z", "--lazy", action="store_true",
                   help="detach now, finish when no longer busy")
    p.set_defaults(func=cmd_umount)


__all__ = ["register"]
