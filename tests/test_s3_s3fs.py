"""s3fs (fsspec's ``s3://``, aiobotocore) against stager's S3 endpoint.

put, get, ls, find, glob, ranged reads through ``open`` and ``cat_file``, and
``pandas.read_parquet`` over ``s3://``, on a real ``stager up --s3-port 0``
cluster; every byte checked against what ``stager://`` holds, both ways.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from stager.testing.s3clients import S3Stack, make_tree, read_dir, s3_stack, write_dir

pytestmark = pytest.mark.slow      # stager up as a subprocess

@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Stack]:
    with s3_stack(tmp_path_factory.mktemp("s3-s3fs"), bucket="s3fs") as stack:
        yield stack


@pytest.fixture
def fs(s3: S3Stack) -> Any:
    """An s3fs filesystem of the test's own (s3fs caches listings per instance)."""
    return s3.endpoint.s3fs()


def test_put_and_get_a_tree(s3: S3Stack, fs: Any, tmp_path: Path) -> None:
    files = make_tree(11)
    write_dir(tmp_path / "up", files)
    fs.put(str(tmp_path / "up"), f"{s3.bucket}/put", recursive=True)
    assert s3.read_tree("put") == files

    theirs = make_tree(12)
    s3.put_tree("get", theirs)
    fs.get(f"{s3.bucket}/get", str(tmp_path / "down"), recursive=True)
    assert read_dir(tmp_path / "down") == theirs


def test_ls_find_glob_see_what_stager_wrote(s3: S3Stack, fs: Any) -> None:
    files = make_tree(13, count=20)
    s3.put_tree("list", files)
    root = f"{s3.bucket}/list"
    found = fs.find(root, detail=True)
    assert {p.removeprefix(root + "/"): e["size"] for p, e in found.items()} == \
        {n: len(d) for n, d in files.items()}

    top = {e["name"].removeprefix(root + "/"): e["type"] for e in fs.ls(root, detail=True)}
    assert top == {**{n: "file" for n in files if "/" not in n},
                   "a": "directory", "c": "directory"}
    assert sorted(fs.glob(f"{root}/a/*.bin")) == sorted(
        f"{root}/{n}" for n in files if n.startswith("a/") and n.count("/") == 1)
    assert sorted(fs.glob(f"{root}/**/f1*.bin")) == sorted(
        f"{root}/{n}" for n in files if n.rsplit("/", 1)[-1].startswith("f1"))
    assert fs.info(f"{root}/c/d/e/f04.bin")["size"] == len(files["c/d/e/f04.bin"])


def test_ranged_reads(s3: S3Stack, fs: Any) -> None:
    data = make_tree(14)["f05.bin"]                  # 300,001 bytes, ranges across it
    s3.fs.pipe_file(s3.path("ranges/x.bin"), data)
    key = f"{s3.bucket}/ranges/x.bin"
    with fs.open(key, "rb", block_size=4096) as f:
        f.seek(1000)
        assert f.read(10_000) == data[1000:11_000]
        f.seek(-100, 2)
        assert f.read() == data[-100:]
        f.seek(5)
        assert f.read(1) == data[5:6]
    assert fs.cat_file(key, start=4095, end=4097) == data[4095:4097]
    assert fs.cat_file(key, start=-17) == data[-17:]
    assert fs.cat_ranges([key] * 3, [0, 300, len(data) - 1], [1, 9000, len(data)]) == [
        data[0:1], data[300:9000], data[-1:]]


def test_open_for_writing_commits_on_close(s3: S3Stack, fs: Any) -> None:
    chunks = [bytes([i]) * 70_000 for i in range(5)]
    with fs.open(f"{s3.bucket}/written/w.bin", "wb") as f:   # under s3fs' 50 MiB block
        for chunk in chunks:
            f.write(chunk)
    assert s3.fs.cat_file(s3.path("written/w.bin")) == b"".join(chunks)


def test_pandas_parquet_both_ways(s3: S3Stack) -> None:
    df = pd.DataFrame({"id": range(5000), "score": [i * 0.5 for i in range(5000)],
                       "name": [f"n{i % 97}" for i in range(5000)]})
    options = s3.endpoint.s3fs_options()

    df.to_parquet(s3.stager_url("pd/from-stager.parquet"))
    back = pd.read_parquet(s3.url("pd/from-stager.parquet"), storage_options=options)
    pd.testing.assert_frame_equal(back, df)
    back = pd.read_parquet(s3.url("pd/from-stager.parquet"), columns=["score"],
                           storage_options=options)
    pd.testing.assert_frame_equal(back, df[["score"]])

    df.to_parquet(s3.url("pd/from-s3.parquet"), storage_options=options)
    raw = s3.endpoint.s3fs().cat_file(f"{s3.bucket}/pd/from-s3.parquet")
    assert s3.fs.cat_file(s3.path("pd/from-s3.parquet")) == raw
    pd.testing.assert_frame_equal(pd.read_parquet(s3.fs.open(s3.path("pd/from-s3.parquet"))),
                                  df)
