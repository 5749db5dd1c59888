"""Inode numbers for a path-based namespace.

stager names things by path; the kernel names them by inode number and
counts its references (``lookup`` adds one, ``forget`` takes them away).  The
:class:`InodeTable` hands out numbers and keeps both maps.

A committed file never changes, so an inode is bound to one *identity*: a
directory, or one committed file (its ``file_id``).  When another file appears
at a known path (written through the API or another mount), the next lookup
gets a new inode, and an ``open`` of the old one answers ``ESTALE``, after which
the kernel looks the path up again.  That is what makes the kernel's page cache
safe to keep (``keep_cache``) and still gives close-to-open consistency.

Pure bookkeeping: no FUSE and no I/O here, so it is tested alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..protocol import paths
from ..protocol.models import FileInfo

ROOT_INODE = 1          # FUSE_ROOT_ID


def identity(info: FileInfo) -> str:
    """What must stay the same for an inode to still describe ``info``."""
    return "dir" if info.is_dir else f"file:{info.file_id}"


@dataclass(eq=False)
class Node:
    ino: int
    path: str                      # path in the stager namespace
    info: FileInfo
    lookups: int = 0               # the kernel's references
    fetched: float = field(default_factory=time.monotonic)
    opens: int = 0                 # open file handles
    data: Any = None               # the shared read cache while the file is open
    upload: Any = None             # the write handle while a new version is being written

    @property
    def is_dir(self) -> bool:
        return self.info.is_dir

    @property
    def identity(self) -> str:
        return identity(self.info)

    def refresh(self, info: FileInfo) -> None:
        self.info = info
        self.fetched = time.monotonic()


class InodeTable:
    """``ino → Node`` for every inode the kernel knows, ``path → Node`` for the live ones."""

    def __init__(self, root: FileInfo) -> None:
        self._next = ROOT_INODE + 1
        self.root = Node(ROOT_INODE, root.path, root, lookups=1)
        self.by_ino: dict[int, Node] = {ROOT_INODE: self.root}
        self.by_path: dict[str, Node] = {root.path: self.root}

    def __len__(self) -> int:
        return len(self.by_ino)

    def get(self, ino: int) -> Node | None:
        return self.by_ino.get(ino)

    def child_path(self, parent: Node, name: str) -> str:
        return paths.join(parent.path, name)

    def bind(self, path: str, info: FileInfo) -> Node:
        """The node for ``info`` at ``path``: the known one if its identity still
        holds, else a new inode (the old one lives on until the kernel forgets it)."""
        node = self.by_path.get(path)
        if node is not None and (node.identity == identity(info) or node.upload is not None):
            if node.upload is None:
                node.refresh(info)
            return node
        return self.fresh(path, info)

    def fresh(self, path: str, info: FileInfo) -> Node:
        """A new inode for ``path`` (a file being created replaces whatever was there)."""
        self.detach(path)
        node = Node(self._next, path, info)
        self._next += 1
        self.by_ino[node.ino] = node
        self.by_path[path] = node
        return node

    def remember(self, path: str, info: FileInfo) -> Node:
        """:meth:`bind`, counting one more kernel reference."""
        node = self.bind(path, info)
        node.lookups += 1
        return node

    def forget(self, ino: int, count: int) -> None:
        node = self.by_ino.get(ino)
        if node is None or node is self.root:
            return
        node.lookups = max(0, node.lookups - count)
        if node.lookups == 0 and node.opens == 0 and node.upload is None:
            del self.by_ino[ino]
            if self.by_path.get(node.path) is node:
                del self.by_path[node.path]

    def detach(self, path: str) -> None:
        """``path`` is gone (unlinked, replaced): its node keeps its number, loses its name."""
        node = self.by_path.pop(path, None)
        if node is not None and node.lookups == 0 and node.opens == 0 and node.upload is None:
            self.by_ino.pop(node.ino, None)

    def moved(self, src: str, dst: str) -> None:
        """``src`` was renamed to ``dst``: it and everything below it change paths."""
        self.detach(dst)
        prefix = src + "/"
        for path in [p for p in self.by_path if p == src or p.startswith(prefix)]:
            node = self.by_path.pop(path)
            node.path = dst + path[len(src):]
            self.by_path[node.path] = node
