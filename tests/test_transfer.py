"""The one transfer layer (stager/client/transfer/): every entry point of put and get
behaves the same.  A get writes a temporary file of its own, renames it into place and
keeps the stager file's mtime, whether it came from the CLI, ``Client``/``AsyncClient``
or the ``stager://`` filesystem; a put keeps the local mtime the same ways."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stager import AsyncClient, Client
from stager.config import load_config
from stager.fs import StagerFileSystem
from stager.protocol.models import LayoutSpec
from stager.testing import ThreadCluster

MiB = 1 << 20
WHEN = 1_234_567_890.25          # an mtime no write of today could have


@pytest.fixture
def fs(cluster: ThreadCluster) -> Iterator[StagerFileSystem]:
    fs = StagerFileSystem(cluster.meta_url, config=load_config(env={}), skip_instance_cache=True)
    yield fs
    fs.close()


def cli(cluster: ThreadCluster, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
    out = subprocess.run([sys.executable, "-m", "stager", "--meta", cluster.meta_url, *args],
                         capture_output=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr.decode()


def only_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


async def test_concurrent_gets_of_one_file_never_collide(aclient: AsyncClient, ns: str,
                                                         tmp_path: Path, payload) -> None:
    """Four gets of one file to one destination at once, three times: each finishes, the
    file is whole, and no temporary file is left (a fixed temporary name collided)."""
    data = payload(6 * MiB + 123)
    await aclient.pipe(f"{ns}/f.bin", data, layout=LayoutSpec(chunk_size=MiB))
    dst = tmp_path / "out" / "f.bin"
    for _ in range(3):
        sizes = await asyncio.gather(*(aclient.get(f"{ns}/f.bin", dst) for _ in range(4)))
        assert sizes == [len(data)] * 4
        assert dst.read_bytes() == data
        assert only_files(tmp_path / "out") == ["f.bin"]


def test_a_get_keeps_the_mtime_through_every_entry_point(
        cluster: ThreadCluster, client: Client, fs: StagerFileSystem, ns: str,
        tmp_path: Path, payload) -> None:
    files = {"a.bin": payload(3 * MiB + 5), "sub/b.txt": b"small"}
    for rel, data in files.items():
        [info] = client.write_many([(f"{ns}/tree/{rel}", data, WHEN)])
        assert not isinstance(info, Exception) and info.mtime == WHEN
    ways: dict[str, Callable[[str, Path], object]] = {
        "cli": lambda src, dst: cli(cluster, "get", src, str(dst)),
        "client": lambda src, dst: client.get(src, dst),
        "fsspec": lambda src, dst: fs.get(src, str(dst), recursive=True),
    }
    for name, get in ways.items():
        one = tmp_path / name / "a.bin"
        one.parent.mkdir()
        get(f"{ns}/tree/a.bin", one)
        assert one.read_bytes() == files["a.bin"]
        assert os.stat(one).st_mtime == WHEN, name
        tree = tmp_path / name / "tree"
        get(f"{ns}/tree", tree)
        assert only_files(tree) == sorted(files), name
        for rel, data in files.items():
            assert (tree / rel).read_bytes() == data
            assert os.stat(tree / rel).st_mtime == WHEN, (name, rel)


def test_a_put_keeps_the_mtime_through_every_entry_point(
        cluster: ThreadCluster, client: Client, fs: StagerFileSystem, ns: str,
        tmp_path: Path, payload) -> None:
    """Small files (written in groups) and large ones (copied in parts) alike."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {"big.bin": payload(5 * MiB + 1), "sub/small.txt": b"tiny", "empty": b""}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
        os.utime(src / rel, (WHEN, WHEN))
    ways: dict[str, Callable[[Path, str], object]] = {
        "cli": lambda local, dst: cli(cluster, "put", str(local), dst),
        "client": lambda local, dst: client.put(local, dst),
        "fsspec": lambda local, dst: fs.put(str(local), dst, recursive=True),
    }
    for name, put in ways.items():
        put(src / "big.bin", f"{ns}/{name}.bin")
        assert client.stat(f"{ns}/{name}.bin").mtime == WHEN, name
        put(src, f"{ns}/{name}")
        for rel, data in files.items():
            info = client.stat(f"{ns}/{name}/{rel}")
            assert (info.size, info.mtime) == (len(data), WHEN), (name, rel)
            assert client.cat(f"{ns}/{name}/{rel}") == data


def test_a_failed_get_leaves_nothing(client: Client, ns: str, tmp_path: Path) -> None:
    """A get that cannot read its source leaves neither the file nor a temporary one."""
    client.pipe(f"{ns}/x", b"x")
    dst = tmp_path / "x"
    dst.mkdir()              # the rename into place fails: a directory is in the way
    with pytest.raises(OSError):
        client.get(f"{ns}/x", dst)
    assert only_files(tmp_path) == []
