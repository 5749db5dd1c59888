"""Letting a test Slurm's unprivileged job user reach this interpreter.

pyenv puts Python under ``/root``, which others may not enter: a test cluster gives its
job user an ACL entry "execute" on each such directory and takes it back when it
stops.  Several clusters (pytest workers, a run beside the suite) share those ACLs
through a small registry, so the first to stop does not cut off the others.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..deploy.jobprocs import pid_alive
from .locks import exclusive

ACL_XATTR = "system.posix_acl_access"


def _acl(mode: int, uid: int) -> bytes:
    """A POSIX access ACL (the kernel's xattr format, version 2): ``mode`` plus execute
    for user ``uid``."""
    undefined = 0xFFFFFFFF
    entries = [(0x01, (mode >> 6) & 7, undefined), (0x02, 1, uid),
               (0x04, (mode >> 3) & 7, undefined), (0x10, ((mode >> 3) & 7) | 1, undefined),
               (0x20, mode & 7, undefined)]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


_holders = itertools.count()
TRAVERSE_REGISTRY = Path(tempfile.gettempdir()) / "stager-traverse.json"


@contextmanager
def _traverse_registry() -> Iterator[dict[str, Any]]:
    """The ACLs test clusters set, with who holds each (``{dir: {"mode", "holders"}}``),
    read and written under an exclusive lock: clusters of several processes (pytest
    workers, a helper's run beside the suite) grant the same directories, and the first
    to stop must not take away what the others still use."""
    with exclusive(TRAVERSE_REGISTRY.with_suffix(".lock")):
        try:
            table = json.loads(TRAVERSE_REGISTRY.read_text())
        except (OSError, ValueError):
            table = {}
        for entry in table.values():    # holders that died without revoking
            entry["holders"] = [h for h in entry["holders"] if pid_alive(int(h.split(":")[0]))]
        yield table
        TRAVERSE_REGISTRY.write_text(json.dumps(table))


def grant_traverse(uid: int, targets: list[str]) -> list[tuple[str, int]]:
    """Let ``uid`` reach ``targets`` (an interpreter under ``/root``, as pyenv puts it):
    an ACL entry "execute for uid" on each directory above them that others may not
    enter.  Returns ``(directory, holder)`` pairs for :func:`revoke_traverse`; an ACL
    another cluster set for the same uid is shared, and removed by the last holder."""
    holder = f"{os.getpid()}:{next(_holders)}"
    done: list[tuple[str, str]] = []
    with _traverse_registry() as table:
        for target in targets:
            for parent in reversed(Path(os.path.realpath(target)).parents):
                key = str(parent)
                st = parent.stat()
                if st.st_mode & 0o001 or any(key == d for d, _ in done):
                    continue
                entry = table.get(key)
                if entry is not None and entry["holders"] and entry["uid"] == uid:
                    entry["holders"].append(holder)     # set by a live cluster: share it
                    done.append((key, holder))
                    continue
                try:
                    os.getxattr(parent, ACL_XATTR)
                    if entry is None:
                        continue            # an ACL of its own: leave it alone
                except OSError:
                    pass
                mode = entry["mode"] if entry else st.st_mode & 0o777
                os.setxattr(parent, ACL_XATTR, _acl(mode, uid))
                table[key] = {"mode": mode, "uid": uid, "holders": [holder]}
                done.append((key, holder))
    return done


def revoke_traverse(granted: list[tuple[str, str]]) -> None:
    """Give up ``granted``; a directory's ACL goes (and its mode comes back) when no
    live cluster holds it any more."""
    if not granted:
        return
    with _traverse_registry() as table:
        for path, holder in granted:
            entry = table.get(path)
            if entry is None:
                continue
            entry["holders"] = [h for h in entry["holders"] if h != holder]
            if entry["holders"]:
                continue
            del table[path]
            try:
                os.removexattr(path, ACL_XATTR)
                os.chmod(path, entry["mode"])   # the group bits showed the ACL's mask
            except OSError:
                pass
