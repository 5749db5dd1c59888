"""Test Slurms' traverse ACLs: shared between clusters, removed by the last one.

Two clusters (two pytest workers, or a run beside the suite) grant the job user the
same directories above the interpreter; before the registry the first to stop took the
ACL away while the other's jobs still ran this Python.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stager.testing import traverse
from stager.testing.traverse import ACL_XATTR, grant_traverse, revoke_traverse


@pytest.fixture
def private(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A file under a directory others may not enter (the only one above it: pytest's
    own tmp_path sits under a 0700 directory), and a registry of this test's own."""
    base = Path(tempfile.mkdtemp(prefix="stager-traverse-"))
    base.chmod(0o755)
    monkeypatch.setattr(traverse, "TRAVERSE_REGISTRY", base / "registry.json")
    top = base / "home"
    (top / "bin").mkdir(parents=True)
    (top / "bin" / "python").write_bytes(b"")
    top.chmod(0o700)
    yield top
    shutil.rmtree(base)


def has_acl(path: Path) -> bool:
    try:
        os.getxattr(path, ACL_XATTR)
        return True
    except OSError:
        return False


def test_the_last_holder_removes_the_acl(private: Path) -> None:
    try:
        first = grant_traverse(65534, [str(private / "bin" / "python")])
    except OSError as e:
        pytest.skip(f"this file system takes no POSIX ACLs: {e}")
    assert [d for d, _ in first] == [str(private)] and has_acl(private)
    second = grant_traverse(65534, [str(private / "bin" / "python")])
    assert [d for d, _ in second] == [str(private)]
    revoke_traverse(first)
    assert has_acl(private), "the first cluster to stop took the second's ACL away"
    revoke_traverse(second)
    assert not has_acl(private)
    assert private.stat().st_mode & 0o777 == 0o700


def test_a_dead_holder_does_not_keep_the_acl(private: Path) -> None:
    """A cluster SIGKILLed with its pytest worker never revokes: its entry stops
    counting, and the next cluster takes the ACL over and removes it when done."""
    child = subprocess.run([sys.executable, "-c", f"""
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from stager.testing import traverse
traverse.TRAVERSE_REGISTRY = Path({str(traverse.TRAVERSE_REGISTRY)!r})
try:
    traverse.grant_traverse(65534, [{str(private / 'bin' / 'python')!r}])
except OSError:
    sys.exit(3)
"""], timeout=60)
    if child.returncode == 3:
        pytest.skip("this file system takes no POSIX ACLs")
    assert child.returncode == 0 and has_acl(private)
    mine = grant_traverse(65534, [str(private / "bin" / "python")])
    assert [d for d, _ in mine] == [str(private)]
    revoke_traverse(mine)
    assert not has_acl(private) and private.stat().st_mode & 0o777 == 0o700


def test_an_acl_set_by_someone_else_is_left_alone(private: Path) -> None:
    try:
        os.setxattr(private, ACL_XATTR, traverse._acl(0o700, 12345))
    except OSError as e:
        pytest.skip(f"this file system takes no POSIX ACLs: {e}")
    assert grant_traverse(65534, [str(private / "bin" / "python")]) == []
    assert has_acl(private)
