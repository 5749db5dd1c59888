"""The AWS CLI (v1, the dev extra's ``awscli``) against stager's S3 endpoint.

``aws s3 cp``, ``sync`` and ``ls --recursive`` on a real ``stager up --s3-port 0``
cluster: what the CLI uploads reads back byte-exact through ``stager://``, and
what stager's client writes the CLI downloads byte-exact.  ``sync`` decides what
to send from sizes and ``LastModified``, so a second sync that sends nothing
shows the listing's times are real (an empty or wrong ``LastModified`` is what
breaks the CLI on other gateways).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from stager.testing.s3clients import S3Stack, make_tree, read_dir, s3_stack, write_dir

pytestmark = pytest.mark.slow      # stager up and the aws CLI as subprocesses

MiB = 1 << 20
LS_LINE = re.compile(r"^(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) +(\d+) (.+)$")


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Stack]:
    with s3_stack(tmp_path_factory.mktemp("s3-awscli"), bucket="awscli") as stack:
        yield stack


def test_cp_of_a_small_file_both_ways(s3: S3Stack, tmp_path: Path) -> None:
    """One PutObject up (below the CLI's 8 MiB multipart threshold), one GetObject down."""
    data = make_tree(1)["c/d/e/f04.bin"]
    src = tmp_path / "up.bin"
    src.write_bytes(data)
    s3.endpoint.aws("s3", "cp", "--no-progress", str(src), s3.url("cp/up.bin"))
    assert s3.fs.cat_file(s3.path("cp/up.bin")) == data

    theirs = b"written by stager's client\n" * 5000
    s3.fs.pipe_file(s3.path("cp/from-stager.bin"), theirs)
    down = tmp_path / "down.bin"
    s3.endpoint.aws("s3", "cp", "--no-progress", s3.url("cp/from-stager.bin"), str(down))
    assert down.read_bytes() == theirs


def test_cp_of_100_mb_goes_multipart(s3: S3Stack, tmp_path: Path) -> None:
    """100 MB is 12 parts of the CLI's 8 MiB: the object's ETag is the multipart
    ``"<md5 of the parts' md5s>-12"``, and its bytes are the file's through stager."""
    import numpy as np

    data = np.random.default_rng(100).integers(0, 256, 100_000_000, dtype=np.uint8).tobytes()
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    s3.endpoint.aws("s3", "cp", "--no-progress", str(src), s3.url("big/big.bin"))

    parts = [data[at:at + 8 * MiB] for at in range(0, len(data), 8 * MiB)]
    expected = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    head = s3.endpoint.boto3().head_object(Bucket=s3.bucket, Key="big/big.bin")
    assert head["ETag"] == f'"{expected}-{len(parts)}"'
    assert s3.fs.info(s3.path("big/big.bin"))["size"] == len(data)
    assert hashlib.sha256(s3.fs.cat_file(s3.path("big/big.bin"))).digest() == \
        hashlib.sha256(data).digest()

    down = tmp_path / "down.bin"
    s3.endpoint.aws("s3", "cp", "--no-progress", s3.url("big/big.bin"), str(down))
    assert hashlib.sha256(down.read_bytes()).digest() == hashlib.sha256(data).digest()


def test_sync_up_then_nothing_left_to_send(s3: S3Stack, tmp_path: Path) -> None:
    files = make_tree(2)
    write_dir(tmp_path / "up", files)
    first = s3.endpoint.aws("s3", "sync", "--no-progress", str(tmp_path / "up"),
                            s3.url("sync-up"))
    assert first.stdout.count("upload:") == len(files), first.stdout
    assert s3.read_tree("sync-up") == files

    # the CLI sends a file again when its size differs or it is newer than the
    # object's LastModified: with real sizes and times there is nothing to send
    again = s3.endpoint.aws("s3", "sync", "--no-progress", str(tmp_path / "up"),
                            s3.url("sync-up"))
    assert "upload:" not in again.stdout, again.stdout

    changed = b"changed after the first sync"
    (tmp_path / "up" / "a" / "f01.bin").write_bytes(changed)
    third = s3.endpoint.aws("s3", "sync", "--no-progress", str(tmp_path / "up"),
                            s3.url("sync-up"))
    assert third.stdout.count("upload:") == 1, third.stdout
    # open stats afresh (close-to-open); cat_file may answer from the stat read_tree
    # cached above, within stat_cache_ttl (docs/client.md, "The stat cache")
    with s3.fs.open(s3.path("sync-up/a/f01.bin"), "rb") as f:
        assert f.read() == changed


def test_sync_down_what_stager_wrote(s3: S3Stack, tmp_path: Path) -> None:
    files = make_tree(3)
    s3.put_tree("sync-down", files)
    first = s3.endpoint.aws("s3", "sync", "--no-progress", s3.url("sync-down"),
                            str(tmp_path / "down"))
    assert first.stdout.count("download:") == len(files), first.stdout
    assert read_dir(tmp_path / "down") == files

    again = s3.endpoint.aws("s3", "sync", "--no-progress", s3.url("sync-down"),
                            str(tmp_path / "down"))
    assert "download:" not in again.stdout, again.stdout


def test_ls_recursive_lists_every_key_with_size_and_time(s3: S3Stack) -> None:
    files = make_tree(4, count=30)
    s3.put_tree("ls", files)
    out = s3.endpoint.aws("s3", "ls", "--recursive", s3.url("ls/")).stdout
    listed: dict[str, int] = {}
    for line in out.splitlines():
        match = LS_LINE.match(line)
        assert match, f"not an `aws s3 ls` line: {line!r}"
        assert int(match.group(1)) >= 2024, f"LastModified is not real: {line!r}"
        listed[match.group(8)] = int(match.group(7))
    assert listed == {f"ls/{name}": len(data) for name, data in files.items()}

    top = s3.endpoint.aws("s3", "ls", s3.url("ls/")).stdout
    assert "PRE a/" in top and "PRE c/" in top, top
