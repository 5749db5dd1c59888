"""The namespace: directories, listings, rename, remove, visibility of uncommitted writes."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from stager import AsyncClient, Client
from stager.errors import DirectoryNotEmpty, InvalidPath, NotADirectory
from stager.testing import ThreadCluster


def test_mkdir_parents_and_errors(client: Client, ns: str) -> None:
    info = client.mkdir(f"{ns}/a/b/c")                     # parents by default
    assert info.is_dir and info.path == f"{ns}/a/b/c"
    assert client.stat(f"{ns}/a/b", cached=False).is_dir
    client.mkdir(f"{ns}/a/b/c")                            # exist_ok by default
    with pytest.raises(FileExistsError):
        client.mkdir(f"{ns}/a/b/c", exist_ok=False)
    with pytest.raises(FileNotFoundError):
        client.mkdir(f"{ns}/x/y", parents=False)
    client.pipe(f"{ns}/file", b"1")
    with pytest.raises(FileExistsError):
        client.mkdir(f"{ns}/file")
    with pytest.raises(NotADirectoryError):
        client.mkdir(f"{ns}/file/sub")
    root = client.stat("/", cached=False)
    assert root.is_dir and root.path == "/"


def test_listing_is_sorted_and_paged(client: Client, ns: str, http,
                                     cluster: ThreadCluster) -> None:
    names = [f"f{i:02d}" for i in range(10)] + ["sub"]
    for name in names[:-1]:
        client.pipe(f"{ns}/{name}", name.encode())
    client.mkdir(f"{ns}/sub")
    listing = client.ls(ns)
    assert [e.name for e in listing] == names
    assert [e.type for e in listing] == ["file"] * 10 + ["directory"]
    assert [e.size for e in listing[:3]] == [3, 3, 3]
    page = http(cluster.meta_url, "GET", f"/v1/list{ns}?limit=4").json()
    assert [e["path"].rsplit("/", 1)[1] for e in page["entries"]] == names[:4]
    assert page["next"] == "f03"
    page2 = http(cluster.meta_url, "GET", f"/v1/list{ns}?limit=4&after=f03").json()
    assert [e["path"].rsplit("/", 1)[1] for e in page2["entries"]] == names[4:8]
    last = http(cluster.meta_url, "GET", f"/v1/list{ns}?limit=4&after=f07").json()
    assert len(last["entries"]) == 3 and last["next"] is None


async def test_async_paging(aclient: AsyncClient, ns: str) -> None:
    for i in range(7):
        await aclient.pipe(f"{ns}/p{i}", b"")
    assert [e.name async for e in aclient.iter_dir(ns, page_size=2)] == \
        [f"p{i}" for i in range(7)]
    assert [e.name for e in await aclient.ls(ns)] == [f"p{i}" for i in range(7)]


def test_ls_of_a_file_and_of_nothing(client: Client, ns: str) -> None:
    client.pipe(f"{ns}/f", b"x")
    with pytest.raises(NotADirectoryError):
        client.ls(f"{ns}/f")
    with pytest.raises(FileNotFoundError):
        client.ls(f"{ns}/missing")
    with pytest.raises(NotADirectoryError):
        client.stat(f"{ns}/f/child", cached=False)


def test_rename_file_and_directory(client: Client, ns: str, payload) -> None:
    data = payload(100_000)
    client.pipe(f"{ns}/d/f.bin", data)
    client.pipe(f"{ns}/d/sub/g.bin", b"g")
    moved = client.rename(f"{ns}/d/f.bin", f"{ns}/d/f2.bin")
    assert moved.path == f"{ns}/d/f2.bin" and moved.size == len(data)
    assert not client.exists(f"{ns}/d/f.bin")
    assert client.cat(f"{ns}/d/f2.bin") == data
    client.mkdir(f"{ns}/e")
    client.rename(f"{ns}/d", f"{ns}/e/d")
    assert client.cat(f"{ns}/e/d/f2.bin") == data
    assert client.cat(f"{ns}/e/d/sub/g.bin") == b"g"
    assert not client.exists(f"{ns}/d")
    with pytest.raises(InvalidPath):
        client.rename(f"{ns}/e", f"{ns}/e/d/inside")
    with pytest.raises(FileNotFoundError):
        client.rename(f"{ns}/nothing", f"{ns}/else")


def test_rename_onto_existing(client: Client, ns: str) -> None:
    client.pipe(f"{ns}/a", b"A")
    client.pipe(f"{ns}/b", b"B")
    with pytest.raises(FileExistsError):
        client.rename(f"{ns}/a", f"{ns}/b")
    assert client.cat(f"{ns}/b") == b"B"
    client.rename(f"{ns}/a", f"{ns}/b", overwrite=True)
    assert client.cat(f"{ns}/b") == b"A"
    assert not client.exists(f"{ns}/a")
    client.mkdir(f"{ns}/dir/child")
    with pytest.raises(IsADirectoryError):
        client.rename(f"{ns}/b", f"{ns}/dir", overwrite=True)
    client.mkdir(f"{ns}/d2")
    with pytest.raises(DirectoryNotEmpty):
        client.rename(f"{ns}/d2", f"{ns}/dir")
    with pytest.raises(NotADirectory):
        client.rename(f"{ns}/d2", f"{ns}/b")


def test_remove_file_and_tree(client: Client, ns: str) -> None:
    client.pipe(f"{ns}/t/a", b"a")
    client.pipe(f"{ns}/t/u/b", b"b")
    client.pipe(f"{ns}/t/u/v/c", b"c")
    client.mkdir(f"{ns}/t/empty")
    assert client.rm(f"{ns}/t/a") == 1
    assert not client.exists(f"{ns}/t/a")
    with pytest.raises(OSError) as err:
        client.rm(f"{ns}/t")
    assert err.value.errno == errno.ENOTEMPTY
    assert client.rm(f"{ns}/t/empty") == 0
    assert client.rm(f"{ns}/t", recursive=True) == 2
    assert not client.exists(f"{ns}/t")
    assert not client.exists(f"{ns}/t/u/v/c")
    with pytest.raises(FileNotFoundError):
        client.rm(f"{ns}/t")
    with pytest.raises(InvalidPath):
        client.rm("/", recursive=True)


async def test_uncommitted_write_is_invisible(aclient: AsyncClient, ns: str) -> None:
    await aclient.mkdir(ns)
    file_id, writer = await aclient.create(f"{ns}/pending.bin")
    await writer.write(b"x" * 70_000)
    assert not await aclient.exists(f"{ns}/pending.bin")
    assert [e.name for e in await aclient.ls(ns)] == []
    info = await aclient.commit(file_id, writer)
    assert info.size == 70_000
    assert [e.name for e in await aclient.ls(ns)] == ["pending.bin"]
    # a second commit of the same upload is refused; the file stays as it was
    with pytest.raises(FileNotFoundError):
        await aclient.commit(file_id, writer)
    # aborted writes never appear
    file_id, writer = await aclient.create(f"{ns}/aborted.bin")
    await writer.write(b"y" * 10)
    await aclient.abort(file_id, writer)
    assert not await aclient.exists(f"{ns}/aborted.bin")


async def test_create_refuses_directories_and_file_parents(aclient: AsyncClient,
                                                           ns: str) -> None:
    await aclient.mkdir(f"{ns}/dir")
    await aclient.pipe(f"{ns}/file", b"f")
    with pytest.raises(IsADirectoryError):
        await aclient.pipe(f"{ns}/dir", b"x")
    with pytest.raises(NotADirectoryError):
        await aclient.pipe(f"{ns}/file/x", b"x")
    with pytest.raises(IsADirectoryError):
        await aclient.pipe("/", b"x")


def test_put_keeps_the_local_mtime_and_copies_trees(client: Client, ns: str,
                                                    tmp_path: Path) -> None:
    src = tmp_path / "tree"
    (src / "a" / "b").mkdir(parents=True)
    (src / "top.txt").write_bytes(b"top")
    (src / "a" / "b" / "deep.txt").write_bytes(b"deep")
    os.utime(src / "top.txt", (1_600_000_000, 1_600_000_000))
    infos = client.put(src, f"{ns}/tree")
    assert sorted(i.path for i in infos) == [f"{ns}/tree/a/b/deep.txt", f"{ns}/tree/top.txt"]
    assert client.stat(f"{ns}/tree/top.txt", cached=False).mtime == 1_600_000_000
    walked = sorted(e.path for e in client.walk(f"{ns}/tree"))
    assert walked == [f"{ns}/tree/a/b/deep.txt", f"{ns}/tree/top.txt"]
    out = tmp_path / "out"
    assert client.get(f"{ns}/tree", out) == 7
    assert (out / "a" / "b" / "deep.txt").read_bytes() == b"deep"
    assert (out / "top.txt").read_bytes() == b"top"


def test_status_counts_targets_and_files(client: Client, cluster: ThreadCluster,
                                         ns: str) -> None:
    client.pipe(f"{ns}/s", b"12345")
    status = client.status()
    assert status["targets_up"] == 3 and status["nodes"] == 3
    assert {t["id"] for t in status["targets"]} == {cluster.target_id(i) for i in range(3)}
    assert all(t["state"] == "up" for t in status["targets"])
    assert status["files"] >= 1 and status["bytes"] >= 5
    assert status["capacity"] > 0
    assert len(client.targets()) == 3


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_client_works_in_a_forked_child(client: Client, ns: str) -> None:
    client.pipe(f"{ns}/forked", b"before fork")
    assert client.cat(f"{ns}/forked") == b"before fork"    # session open in the parent
    pid = os.fork()
    if pid == 0:                                           # the child: report by exit code
        code = 1
        try:
            ok = client.cat(f"{ns}/forked") == b"before fork"
            client.pipe(f"{ns}/from-child", b"child")
            code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert client.cat(f"{ns}/from-child") == b"child"
