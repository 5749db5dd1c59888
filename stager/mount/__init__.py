"""``stager mount``: the namespace as a real FUSE file system (pyfuse3, libfuse 3).

``fs`` holds the FUSE operations, ``inodes`` the inode numbers of a path-based
namespace, ``cache`` the striped readahead of open files, ``handles`` the open
files and directories, ``runner`` the daemon and the unmount.  Only ``fs`` and
``runner.serve`` need pyfuse3 (the ``fuse`` extra).
"""

from .options import MountOptions
from .runner import mount_entry, run_foreground, spawn, unmount

__all__ = ["MountOptions", "mount_entry", "run_foreground", "spawn", "unmount"]
