"""Arrow's C++ S3 client (``pyarrow.fs.S3FileSystem``) against stager's S3 endpoint.

Not boto: Arrow signs, lists and reads with the AWS C++ SDK.  A partitioned
Parquet dataset written with ``pyarrow.dataset`` through S3 reads back equal
through S3 and byte-exact through ``stager://``; one written through
``stager://`` reads through S3.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from pyarrow import fs as pafs

from stager.testing.s3clients import S3Stack, s3_stack

pytestmark = pytest.mark.slow      # stager up as a subprocess

ROWS = 20_000


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Stack]:
    with s3_stack(tmp_path_factory.mktemp("s3-pyarrow"), bucket="arrow") as stack:
        yield stack


@pytest.fixture(params=["default", "when_required"])
def writer(request: pytest.FixtureRequest, s3: S3Stack,
           monkeypatch: pytest.MonkeyPatch) -> pafs.S3FileSystem:
    """Arrow's client to upload with: as it comes (an aws-chunked body with a CRC64NVME
    trailer on every upload) and with ``AWS_REQUEST_CHECKSUM_CALCULATION=when_required``
    (a plain body, no checksum)."""
    if request.param == "when_required":
        monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    return s3.endpoint.pyarrow()


def table() -> pa.Table:
    return pa.table({"split": [["train", "val", "test"][i % 3] for i in range(ROWS)],
                     "shard": [i % 4 for i in range(ROWS)],
                     "id": list(range(ROWS)),
                     "x": [i / 7 for i in range(ROWS)]})


def same(read: pa.Table, written: pa.Table) -> bool:
    """Equal rows, whatever the column order and the types hive partitioning inferred."""
    names = ["id", "x", "split", "shard"]
    written = written.select(names).sort_by("id")
    return read.select(names).sort_by("id").cast(written.schema).equals(written)


def test_partitioned_dataset_written_through_s3(s3: S3Stack, writer: pafs.S3FileSystem,
                                                request: pytest.FixtureRequest) -> None:
    s3fs = writer
    base = f"{s3.bucket}/through-s3-{request.node.callspec.id}"
    ds.write_dataset(table(), base, filesystem=s3fs, format="parquet",
                     partitioning=["split", "shard"], partitioning_flavor="hive",
                     max_rows_per_group=2000)

    infos = s3fs.get_file_info(pafs.FileSelector(base, recursive=True))
    files = {i.path: i.size for i in infos if i.type == pafs.FileType.File}
    assert len(files) == 12                    # 3 splits x 4 shards
    assert {i.path for i in infos if i.type == pafs.FileType.Directory} >= {
        f"{base}/split=train", f"{base}/split=val/shard=3"}

    back = ds.dataset(base, filesystem=s3fs, format="parquet", partitioning="hive").to_table()
    assert same(back, table())
    val = ds.dataset(base, filesystem=s3fs, format="parquet", partitioning="hive").to_table(
        columns=["id"], filter=ds.field("split") == "val")
    assert sorted(val["id"].to_pylist()) == list(range(1, ROWS, 3))

    for path, size in files.items():
        with s3fs.open_input_file(path) as f:
            raw = f.read()
        assert len(raw) == size
        assert s3.fs.cat_file(f"/{path}") == raw


def test_partitioned_dataset_written_through_stager(s3: S3Stack) -> None:
    base = f"{s3.bucket}/through-stager"
    ds.write_dataset(table(), base, filesystem=pafs.PyFileSystem(pafs.FSSpecHandler(s3.fs)),
                     format="parquet", partitioning=["split"], partitioning_flavor="hive")

    s3fs = s3.endpoint.pyarrow()
    back = ds.dataset(base, filesystem=s3fs, format="parquet", partitioning="hive").to_table()
    assert same(back, table())
    for path in s3.fs.find(f"/{base}"):
        with s3fs.open_input_stream(path.lstrip("/")) as f:
            assert f.read() == s3.fs.cat_file(path)
        with s3fs.open_input_file(path.lstrip("/")) as f:     # ranged reads
            f.seek(4)
            assert f.read(100) == s3.fs.cat_file(path, start=4, end=104)


def test_output_stream_and_delete(s3: S3Stack, writer: pafs.S3FileSystem,
                                  request: pytest.FixtureRequest) -> None:
    """Arrow's output stream creates a multipart upload when it opens (unless
    ``allow_delayed_open``): 1 MB is one part.  A path of its own per case: stager's
    client caches a stat for ``stat_cache_ttl`` (1 s), so a file deleted and written
    again within that second could read through the old layout."""
    s3fs = writer
    path = f"{s3.bucket}/stream/out-{request.node.callspec.id}.bin"
    data = bytes(range(256)) * 4000
    with s3fs.open_output_stream(path) as out:
        out.write(data[:300_000])
        out.write(data[300_000:])
    assert s3.fs.cat_file(f"/{path}") == data
    s3fs.delete_file(path)
    assert not s3.fs.exists(f"/{path}")
    assert s3fs.get_file_info(path).type == pafs.FileType.NotFound

