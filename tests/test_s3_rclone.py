"""rclone (Debian's package, ``make sysdeps``) against stager's S3 endpoint.

A remote from the environment alone (``S3Endpoint.rclone_env``): ``rclone copy``
up and down, ``rclone check`` (sizes, and MD5s where the ETag is one), byte-exact
through ``stager://`` both ways; a file changed behind rclone's back is a
difference ``check`` reports.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stager.testing.s3clients import S3Stack, make_tree, read_dir, s3_stack, write_dir

pytestmark = pytest.mark.slow      # stager up and rclone as subprocesses


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Stack]:
    with s3_stack(tmp_path_factory.mktemp("s3-rclone"), bucket="rclone") as stack:
        yield stack


def remote(s3: S3Stack, key: str) -> str:
    return f"st:{s3.bucket}/{key}"


def test_copy_up_then_check(s3: S3Stack, tmp_path: Path) -> None:
    files = make_tree(21, count=20)
    write_dir(tmp_path / "up", files)
    s3.endpoint.rclone("copy", str(tmp_path / "up"), remote(s3, "up"))
    assert s3.read_tree("up") == files

    check = s3.endpoint.rclone("check", str(tmp_path / "up"), remote(s3, "up"))
    assert "0 differences found" in check.stderr, check.stderr
    assert f"{len(files)} matching files" in check.stderr, check.stderr

    listed = s3.endpoint.rclone("lsl", remote(s3, "up")).stdout.splitlines()
    sizes = {line.split(maxsplit=3)[3]: int(line.split()[0]) for line in listed}
    assert sizes == {name: len(data) for name, data in files.items()}


def test_check_finds_a_file_changed_through_stager(s3: S3Stack, tmp_path: Path) -> None:
    files = make_tree(22)
    write_dir(tmp_path / "src", files)
    s3.endpoint.rclone("copy", str(tmp_path / "src"), remote(s3, "changed"))
    victim = "c/d/e/f04.bin"
    s3.fs.pipe_file(s3.path(f"changed/{victim}"), b"not what rclone sent")

    check = s3.endpoint.rclone("check", str(tmp_path / "src"), remote(s3, "changed"),
                               check=False)
    assert check.returncode == 1, check.stderr
    assert "1 differences found" in check.stderr, check.stderr
    assert victim in check.stderr, check.stderr


def test_copy_down_what_stager_wrote(s3: S3Stack, tmp_path: Path) -> None:
    files = make_tree(23, count=16)
    s3.put_tree("down", files)
    s3.endpoint.rclone("copy", remote(s3, "down"), str(tmp_path / "down"))
    assert read_dir(tmp_path / "down") == files

    check = s3.endpoint.rclone("check", "--download", str(tmp_path / "down"),
                               remote(s3, "down"))
    assert "0 differences found" in check.stderr, check.stderr

    again = s3.endpoint.rclone("copy", "-v", remote(s3, "down"), str(tmp_path / "down"))
    assert "Copied" not in again.stderr, again.stderr      # sizes and times already match
