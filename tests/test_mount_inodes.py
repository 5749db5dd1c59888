"""The inode table of the mount, alone (no FUSE needed)."""

from __future__ import annotations

from stager.mount.inodes import ROOT_INODE, InodeTable
from stager.protocol.models import FileInfo


def d(path: str) -> FileInfo:
    return FileInfo(path=path, type="directory")


def f(path: str, file_id: str = "a" * 32, size: int = 1) -> FileInfo:
    return FileInfo(path=path, type="file", size=size, file_id=file_id)


def test_same_identity_keeps_the_inode_and_refreshes() -> None:
    t = InodeTable(d("/"))
    a = t.remember("/x", f("/x"))
    b = t.remember("/x", f("/x", size=1))
    assert a is b and a.lookups == 2 and a.ino != ROOT_INODE


def test_another_file_at_a_path_gets_a_new_inode() -> None:
    t = InodeTable(d("/"))
    old = t.remember("/x", f("/x", "a" * 32))
    new = t.remember("/x", f("/x", "b" * 32))
    assert new.ino != old.ino
    assert t.get(old.ino) is old            # the kernel still holds it
    assert t.by_path["/x"] is new
    t.forget(old.ino, 1)
    assert t.get(old.ino) is None and t.by_path["/x"] is new


def test_forget_drops_only_unreferenced_inodes() -> None:
    t = InodeTable(d("/"))
    n = t.remember("/x", f("/x"))
    n.opens = 1
    t.forget(n.ino, 1)
    assert t.get(n.ino) is n                # still open
    n.opens = 0
    t.forget(n.ino, 0)
    assert t.get(n.ino) is None and "/x" not in t.by_path
    t.forget(ROOT_INODE, 5)
    assert t.get(ROOT_INODE) is t.root


def test_rename_moves_a_subtree_and_replaces_the_target() -> None:
    t = InodeTable(d("/"))
    top = t.remember("/a", d("/a"))
    leaf = t.remember("/a/b/c", f("/a/b/c"))
    victim = t.remember("/z", d("/z"))
    t.moved("/a", "/z")
    assert top.path == "/z" and leaf.path == "/z/b/c"
    assert t.by_path["/z"] is top and t.by_path["/z/b/c"] is leaf
    assert "/a" not in t.by_path and t.get(victim.ino) is victim   # until forgotten
    t.forget(victim.ino, 1)
    assert t.get(victim.ino) is None


def test_subtree_root() -> None:
    t = InodeTable(d("/data/set"))
    assert t.root.path == "/data/set" and t.child_path(t.root, "x") == "/data/set/x"
