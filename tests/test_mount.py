"""``stager mount``: real FUSE mounts read and written by ordinary programs."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from stager import Client
from stager.protocol.models import LayoutSpec
from stager.testing import ThreadCluster
from stager.testing.mount import Mounted, fuse_unavailable

WHY_NOT = fuse_unavailable()
pytestmark = [pytest.mark.fuse,
              pytest.mark.skipif(WHY_NOT is not None, reason=f"no FUSE here: {WHY_NOT}")]

MiB = 1 << 20


def run(*cmd: str, cwd: Path | None = None) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=cwd).stdout


def cat_now(client: Client, path: str) -> bytes:
    """The file's bytes as the cluster has them now (not the client's cached stat)."""
    client.stat(path, cached=False)
    return client.cat(path)


def test_ls_find_cat_md5sum(client: Client, ns: str, here: Path, payload) -> None:
    data = payload(3 * MiB + 5)
    client.pipe(f"{ns}/sub/deep/file.bin", data)
    client.pipe(f"{ns}/hello.txt", b"hello, world\n")
    listing = run("ls", "-l", str(here)).splitlines()
    assert listing[0].startswith("total")
    assert any(line.startswith("-rw-r--r--") and line.endswith(" hello.txt")
               and " 13 " in line for line in listing)
    assert any(line.startswith("drwxr-xr-x") and line.endswith(" sub") for line in listing)
    found = sorted(run("find", ".", cwd=here).split())
    assert found == [".", "./hello.txt", "./sub", "./sub/deep", "./sub/deep/file.bin"]
    assert run("cat", str(here / "hello.txt")) == "hello, world\n"
    md5 = run("md5sum", str(here / "sub/deep/file.bin")).split()[0]
    assert md5 == hashlib.md5(data).hexdigest()
    assert os.stat(here / "sub/deep/file.bin").st_size == len(data)


def test_cp_r_in_and_out(client: Client, ns: str, here: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    for i, size in enumerate([0, 1, 4095, MiB, 4 * MiB + 3]):
        (src / f"d{i % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 2}" / f"f{i}.bin").write_bytes(os.urandom(size))
    run("cp", "-r", str(src), str(here / "copy"))
    # in: every byte reached the cluster, seen through the client
    for local in src.rglob("*.bin"):
        remote = f"{ns}/copy/{local.relative_to(src).as_posix()}"
        assert client.cat(remote) == local.read_bytes()
    # out: and back to the local disk through the mount
    run("cp", "-r", str(here / "copy"), str(tmp_path / "back"))
    assert run("diff", "-r", str(src), str(tmp_path / "back")) == ""


def test_python_open_seek_read(client: Client, ns: str, here: Path, payload) -> None:
    data = payload(9 * MiB + 123)
    client.pipe(f"{ns}/f.bin", data, layout=LayoutSpec(chunk_size=MiB))
    with open(here / "f.bin", "rb") as f:
        assert f.read(10) == data[:10]
        f.seek(5 * MiB - 7)
        assert f.read(MiB + 14) == data[5 * MiB - 7:6 * MiB + 7]
        f.seek(-100, os.SEEK_END)
        assert f.read() == data[-100:]
        assert f.read() == b""
        f.seek(123)
        assert f.tell() == 123
        assert f.read(1) == data[123:124]
    fd = os.open(here / "f.bin", os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 8 * MiB + 1) == data[8 * MiB + 1:8 * MiB + 4097]
    finally:
        os.close(fd)


def test_256_mib_random_file_byte_exact(client: Client, ns: str, here: Path,
                                        mnt: Mounted) -> None:
    data = os.urandom(256 * MiB)
    client.pipe(f"{ns}/big.bin", data)
    digest = hashlib.sha256()
    before = mnt.stats()
    with open(here / "big.bin", "rb", buffering=0) as f:
        while block := f.read(4 * MiB):
            digest.update(block)
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
    after = mnt.stats()
    assert after["read_bytes"] - before["read_bytes"] >= len(data)  # type: ignore[operator]
    assert after["max_read"] >= MiB      # the kernel asks for 1 MiB at a time


def test_chunk_buffers_are_reused_from_file_to_file(client: Client, ns: str, here: Path,
                                                   mnt: Mounted) -> None:
    a, b = os.urandom(12 * MiB), os.urandom(12 * MiB)      # three whole chunks each
    client.pipe(f"{ns}/a.bin", a)
    client.pipe(f"{ns}/b.bin", b)
    assert (here / "a.bin").read_bytes() == a
    allocated = mnt.stats()["buffers_allocated"]
    assert (here / "b.bin").read_bytes() == b        # from a's buffers, once a was closed
    assert mnt.stats()["buffers_allocated"] == allocated


def test_write_through_mount_then_read_everywhere(client: Client, ns: str, here: Path,
                                                  tmp_path: Path) -> None:
    data = os.urandom(6 * MiB + 9)
    with open(here / "new.bin", "wb") as f:
        for i in range(0, len(data), 100_000):
            f.write(data[i:i + 100_000])
    assert cat_now(client, f"{ns}/new.bin") == data     # committed when close returned
    assert (here / "new.bin").read_bytes() == data
    (here / "new.bin").write_bytes(b"replaced")         # O_TRUNC: a new version
    assert cat_now(client, f"{ns}/new.bin") == b"replaced"
    (here / "empty").touch()
    assert client.stat(f"{ns}/empty").size == 0


def test_shell_redirection_keeps_every_byte(client: Client, ns: str, here: Path) -> None:
    # The shell closes a duplicate descriptor (a commit) before the command writes.
    subprocess.run(f"printf 'one\\n' > {here}/log; (echo two; echo three) >> {here}/log2; "
                   f"exec 3>{here}/out; echo a >&3; exec 4>&3; exec 4>&-; echo b >&3",
                   shell=True, check=True, executable="/bin/bash")
    assert cat_now(client, f"{ns}/log") == b"one\n"
    assert cat_now(client, f"{ns}/log2") == b"two\nthree\n"
    assert cat_now(client, f"{ns}/out") == b"a\nb\n"


def test_close_to_open(client: Client, ns: str, here: Path) -> None:
    client.pipe(f"{ns}/c.txt", b"first version")
    assert (here / "c.txt").read_bytes() == b"first version"
    client.pipe(f"{ns}/c.txt", b"second, longer version")      # replaced elsewhere
    assert (here / "c.txt").read_bytes() == b"second, longer version"
    client.pipe(f"{ns}/appeared.txt", b"new")                   # created elsewhere
    assert (here / "appeared.txt").read_bytes() == b"new"
    client.rm(f"{ns}/appeared.txt")
    with pytest.raises(FileNotFoundError):
        open(here / "appeared.txt", "rb")


def test_fio_sequential_read(client: Client, ns: str, here: Path, tmp_path: Path) -> None:
    if shutil.which("fio") is None:
        pytest.skip("fio is not installed (make sysdeps)")
    client.pipe(f"{ns}/fio.dat", os.urandom(64 * MiB))
    out = run("fio", "--name=seqread", f"--filename={here / 'fio.dat'}", "--rw=read",
              "--bs=1M", "--size=64M", "--ioengine=psync", "--readonly",
              "--output-format=json")
    job = json.loads(out)["jobs"][0]
    assert job["error"] == 0
    assert job["read"]["io_bytes"] == 64 * MiB


def test_read_only_mount_and_subtree(client: Client, ns: str, cluster: ThreadCluster,
                                     tmp_path: Path) -> None:
    client.pipe(f"{ns}/inside/a.txt", b"a")
    with Mounted(cluster.meta_url, tmp_path / "ro", path=f"{ns}/inside",
                 args=("--read-only",)) as m:
        assert sorted(os.listdir(m.mountpoint)) == ["a.txt"]
        assert (m.mountpoint / "a.txt").read_bytes() == b"a"
        assert "ro" in run("findmnt", "-n", "-o", "OPTIONS", str(m.mountpoint)).split(",")


def test_umount_and_sigterm_end_the_daemon(cluster: ThreadCluster, tmp_path: Path) -> None:
    m = Mounted(cluster.meta_url, tmp_path / "a").start()
    try:
        assert os.path.ismount(m.mountpoint)
        m.cli("umount", str(m.mountpoint))
        assert not os.path.ismount(m.mountpoint)
        assert m.wait_exit(), "the daemon outlived `stager umount`"
        m.start()
        assert m.pid is not None
        os.kill(m.pid, 15)
        assert m.wait_exit(), "the daemon ignored SIGTERM"
        assert not os.path.ismount(m.mountpoint)
        assert not m.pid_file.exists()
    finally:
        m.stop()


def test_mount_errors_are_clear(cluster: ThreadCluster, client: Client, ns: str,
                                tmp_path: Path) -> None:
    m = Mounted(cluster.meta_url, tmp_path / "x")
    (tmp_path / "x").mkdir()
    done = m.cli("mount", str(m.mountpoint), "--path", f"{ns}/missing", "--log",
                 str(m.log_file), check=False)
    assert done.returncode == 1 and "no such file or directory" in done.stderr.lower()
    assert not os.path.ismount(m.mountpoint)
    done = m.cli("umount", str(m.mountpoint), check=False)
    assert done.returncode == 1 and "not mounted" in done.stderr


def test_example_script(cluster: ThreadCluster, tmp_path: Path) -> None:
    script = Path(__file__).parent.parent / "clients" / "mount_example.sh"
    env = {**os.environ, "STAGER_META_URL": cluster.meta_url, "MOUNTPOINT": str(tmp_path / "m"),
           "STAGER": f"{sys.executable} -m stager"}
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "md5 ok" in done.stdout
    assert not os.path.ismount(tmp_path / "m")


def test_times_modes_and_a_second_writer(client: Client, ns: str, here: Path) -> None:
    with open(here / "t.bin", "wb") as f:
        f.write(b"data")
        os.utime(f.fileno(), (1_000_000_000, 1_234_567_890))   # before close: kept
        with pytest.raises(OSError) as second:
            open(here / "t.bin", "wb")
        assert second.value.errno == errno.EBUSY                # one writer at a time
    assert client.stat(f"{ns}/t.bin", cached=False).mtime == 1_234_567_890
    assert os.stat(here / "t.bin").st_mtime == 1_234_567_890
    os.chmod(here / "t.bin", 0o600)                             # accepted, no effect
    assert stat.S_IMODE(os.stat(here / "t.bin").st_mode) == 0o644
    assert (here / "t.bin").read_bytes() == b"data"


def test_big_directory_is_listed_page_by_page(client: Client, ns: str, cluster: ThreadCluster,
                                              tmp_path: Path) -> None:
    names = [f"f{i:03d}" for i in range(45)]
    for i, name in enumerate(names):
        client.pipe(f"{ns}/big/{name}", b"x" * i)
    with Mounted(cluster.meta_url, tmp_path / "m", path=f"{ns}/big",
                 env={"STAGER_LIST_PAGE_SIZE": "7"}) as m:      # 7 pages of 7 entries
        assert sorted(os.listdir(m.mountpoint)) == names
        sizes = {e.name: e.stat().st_size for e in os.scandir(m.mountpoint)}
        assert sizes == {name: i for i, name in enumerate(names)}


def test_a_killed_daemon_is_cleaned_up_by_umount(cluster: ThreadCluster, tmp_path: Path) -> None:
    m = Mounted(cluster.meta_url, tmp_path / "k").start()
    try:
        assert m.pid is not None
        os.kill(m.pid, 9)
        assert m.wait_exit()
        with pytest.raises(OSError) as dead:
            os.listdir(m.mountpoint)
        assert dead.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)   # the kernel's word
        again = m.cli("mount", str(m.mountpoint), check=False)
        assert again.returncode == 1 and "umount" in again.stderr     # says what to do
        m.cli("umount", str(m.mountpoint))
        m.start()                                                  # and it mounts again
        assert os.listdir(m.mountpoint) is not None
    finally:
        m.stop()
