"""The mount against a local directory: the same operations, the same answers.

A hypothesis state machine applies mkdir, write (a new file or a new version),
read, rename, unlink, rmdir and listdir to a directory on the mount and to one
on the local disk, and requires the same result or the same errno each time,
and the same tree (names and bytes) after every step.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from stager.testing import ProcessCluster, wait_for_targets
from stager.testing.mount import Mounted, fuse_unavailable

WHY_NOT = fuse_unavailable()
pytestmark = [pytest.mark.fuse,
              pytest.mark.skipif(WHY_NOT is not None, reason=f"no FUSE here: {WHY_NOT}")]

NAMES = st.sampled_from(["d", "f", "g", "x"])
PATHS = st.lists(NAMES, min_size=1, max_size=2).map("/".join)
DATA = st.binary(max_size=2000) | st.sampled_from([b"", os.urandom(70_000)])


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return ("ok", fn())
    except OSError as exc:
        return ("error", exc.errno)


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path below ``root``: a file's bytes, or None for a directory."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirs, files in os.walk(root):
        base = Path(dirpath)
        for d in dirs:
            out[(base / d).relative_to(root).as_posix()] = None
        for f in files:
            out[(base / f).relative_to(root).as_posix()] = (base / f).read_bytes()
    return out


def write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


class MountMatchesLocalDisk(RuleBasedStateMachine):
    mount: Path
    disk: Path
    files = Bundle("files")          # names written to (they may be gone since)
    dirs = Bundle("dirs")            # names made directories

    def __init__(self) -> None:
        super().__init__()
        name = uuid.uuid4().hex[:8]
        self.roots = (self.mount / name, self.disk / name)
        for root in self.roots:
            root.mkdir()

    # A small tree to start from, so that most operations meet something.
    @initialize(target=dirs)
    def seed_dir(self) -> str:
        self.same(lambda root: os.mkdir(root / "d"))
        return "d"

    @initialize(target=files, content=DATA)
    def seed_file(self, content: bytes) -> str:
        self.same(lambda root: write(root / "f", content))
        return "f"

    @initialize(target=files, content=DATA)
    def seed_nested_file(self, content: bytes) -> str:
        self.same(lambda root: write(root / "d" / "g", content))
        return "d/g"

    def same(self, fn: Callable[[Path], Any]) -> None:
        on_mount, on_disk = (outcome(lambda r=r: fn(r)) for r in self.roots)
        assert on_mount == on_disk

    @rule(target=dirs, p=PATHS)
    def mkdir(self, p: str) -> str:
        self.same(lambda root: os.mkdir(root / p))
        return p

    @rule(target=files, p=PATHS | dirs.map(lambda d: d + "/n"), content=DATA)
    def write_file(self, p: str, content: bytes) -> str:
        self.same(lambda root: write(root / p, content))
        return p

    @rule(p=files, content=DATA)
    def write_again(self, p: str, content: bytes) -> None:
        self.same(lambda root: write(root / p, content))

    @rule(p=files | dirs | PATHS)
    def read(self, p: str) -> None:
        self.same(lambda root: (root / p).read_bytes())

    @rule(src=files | dirs, dst=files | dirs | PATHS)
    def rename(self, src: str, dst: str) -> None:
        self.same(lambda root: os.rename(root / src, root / dst))

    @rule(p=files | dirs)
    def unlink(self, p: str) -> None:
        self.same(lambda root: os.unlink(root / p))

    @rule(p=dirs | files)
    def rmdir(self, p: str) -> None:
        self.same(lambda root: os.rmdir(root / p))

    @rule(p=st.just("") | dirs | files)
    def listdir(self, p: str) -> None:
        self.same(lambda root: sorted(os.listdir(root / p)))

    @invariant()
    def same_tree(self) -> None:
        on_mount, on_disk = (tree(r) for r in self.roots)
        assert on_mount == on_disk


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    """Servers in their own processes: this module's busy test process (hypothesis)
    must not be mistaken for a server that blocks its event loop."""
    with ProcessCluster(tmp_path_factory.mktemp("cluster"), 3) as c:
        wait_for_targets(c.meta_url, 3)
        yield c


def test_mount_matches_local_disk(mnt: Mounted, tmp_path: Path) -> None:
    MountMatchesLocalDisk.mount = mnt.mountpoint
    MountMatchesLocalDisk.disk = tmp_path
    run_state_machine_as_test(MountMatchesLocalDisk, settings=settings(
        max_examples=20, stateful_step_count=15, deadline=None, database=None,
        phases=[Phase.generate],       # no shrinking: each step is real I/O; keep it quick
        suppress_health_check=[HealthCheck.too_slow]))
