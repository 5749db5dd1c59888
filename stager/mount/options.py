"""What one mount is asked to do: a small frozen value, built by the CLI."""

from __future__ import annotations

import os
from dataclasses import dataclass

MiB = 1 << 20


def resolve(mountpoint: str) -> str:
    """The absolute, symlink-free path of a mount point, found without touching the
    mount point itself: a hung mount would hang the caller, and the daemon must not
    stat its own mount before it answers."""
    parent, name = os.path.split(os.path.abspath(mountpoint))
    return os.path.join(os.path.realpath(parent), name)


@dataclass(frozen=True)
class MountOptions:
    mountpoint: str
    path: str = "/"                  # the namespace directory shown at the mount point
    read_only: bool = False
    attr_timeout: float = 1.0        # seconds the kernel may reuse attributes
    entry_timeout: float = 1.0       # seconds the kernel may reuse a name → inode answer
    readahead_chunks: int = 8        # whole chunks fetched ahead of a sequential reader
    kernel_readahead: int = 4 * MiB  # the mount's read_ahead_kb: how far the kernel reads ahead
    list_page_size: int = 1000       # directory entries per metadata request

    @property
    def abs_mountpoint(self) -> str:
        return resolve(self.mountpoint)
