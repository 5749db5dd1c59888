"""DuckDB's httpfs against stager's S3 endpoint.

DuckDB cannot download its extensions here: httpfs is LOADed from the file the
``duckdb-ext-httpfs`` package installs (``S3Endpoint.duckdb``).  ``read_parquet``
over an ``s3://…/*.parquet`` glob lists with ListObjectsV2 and reads footers and
column chunks with ranged GETs; ``COPY … TO 's3://…'`` sends a file under one part
(``s3_uploader_max_filesize`` / 10,000, at least 5 MiB) as one PutObject and a
larger one as a multipart upload.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stager.testing.s3clients import S3Stack, s3_stack

pytestmark = pytest.mark.slow      # stager up as a subprocess

FILES, ROWS = 5, 30_000


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Stack]:
    with s3_stack(tmp_path_factory.mktemp("s3-duckdb"), bucket="duck") as stack:
        yield stack


@pytest.fixture(scope="module")
def written(s3: S3Stack) -> pa.Table:
    """FILES Parquet files written through ``stager://`` (several row groups each)."""
    parts = []
    for i in range(FILES):
        part = pa.table({"id": pa.array(range(i * ROWS, (i + 1) * ROWS), pa.int64()),
                         "file": pa.array([i] * ROWS, pa.int32()),
                         "label": pa.array([f"l{j % 13}" for j in range(ROWS)])})
        with s3.fs.open(s3.path(f"in/part-{i}.parquet"), "wb") as f:
            pq.write_table(part, f, row_group_size=7000)
        parts.append(part)
    return pa.concat_tables(parts)


def test_read_parquet_glob(s3: S3Stack, written: pa.Table) -> None:
    con = s3.endpoint.duckdb()
    glob = s3.url("in/*.parquet")
    count, total = con.execute(f"SELECT count(*), sum(id) FROM read_parquet('{glob}')").fetchone()
    assert (count, total) == (FILES * ROWS, sum(range(FILES * ROWS)))

    by_label = dict(con.execute(
        f"SELECT label, count(*) FROM read_parquet('{glob}') GROUP BY label").fetchall())
    assert by_label == {f"l{k}": sum(1 for j in range(ROWS) if j % 13 == k) * FILES
                        for k in range(13)}

    files = con.execute(f"SELECT DISTINCT filename FROM read_parquet('{glob}', "
                        "filename=true) ORDER BY 1").fetchall()
    assert [f for (f,) in files] == [s3.url(f"in/part-{i}.parquet") for i in range(FILES)]

    back = con.execute(f"SELECT id, file, label FROM read_parquet('{glob}') ORDER BY id")
    back = back.fetch_arrow_table()
    assert back.equals(written.sort_by("id"))


def test_glob_lists_each_file(s3: S3Stack, written: pa.Table) -> None:
    con = s3.endpoint.duckdb()
    listed = con.execute(f"SELECT file FROM glob('{s3.url('in/*')}') ORDER BY 1").fetchall()
    assert [f for (f,) in listed] == [s3.url(f"in/part-{i}.parquet") for i in range(FILES)]


def test_copy_to_s3_reads_back_through_stager(s3: S3Stack) -> None:
    """A file under one upload part: DuckDB sends it as one PutObject."""
    con = s3.endpoint.duckdb()
    out = s3.url("out/copied.parquet")
    con.execute(f"COPY (SELECT range AS id, range % 7 AS k FROM range(100000)) "
                f"TO '{out}' (FORMAT parquet)")
    through_stager = pq.read_table(s3.fs.open(s3.path("out/copied.parquet")))
    assert through_stager["id"].to_pylist() == list(range(100_000))

    (count, total), = con.execute(f"SELECT count(*), sum(k) FROM read_parquet('{out}')").fetchall()
    assert (count, total) == (100_000, sum(i % 7 for i in range(100_000)))

    con.execute(f"COPY (SELECT range AS id, range % 3 AS part FROM range(3000)) "
                f"TO '{s3.url('out/parted')}' (FORMAT parquet, PARTITION_BY (part))")
    assert sorted(p.rsplit("/", 2)[-2] for p in s3.fs.find(s3.path("out/parted"))) == [
        "part=0", "part=1", "part=2"]
    parted = con.execute(f"SELECT part, count(*) FROM read_parquet('{s3.url('out/parted')}"
                         "/*/*.parquet', hive_partitioning=true) GROUP BY 1 ORDER BY 1")
    assert parted.fetchall() == [(0, 1000), (1, 1000), (2, 1000)]


def test_copy_of_18_mb_goes_multipart(s3: S3Stack) -> None:
    """DuckDB's part size is s3_uploader_max_filesize / 10,000 (at least 5 MiB): with
    50 MB the 18 MB file goes up as 4 parts (ETag ``"…-4"``)."""
    con = s3.endpoint.duckdb()
    con.execute("SET s3_uploader_max_filesize = '50MB'")
    out = s3.url("out/multipart.parquet")
    con.execute(f"COPY (SELECT hash(range) AS h, range AS id FROM range(1500000)) "
                f"TO '{out}' (FORMAT parquet)")
    head = s3.endpoint.boto3().head_object(Bucket=s3.bucket, Key="out/multipart.parquet")
    assert head["ETag"].endswith('-4"'), head["ETag"]
    through_stager = pq.read_table(s3.fs.open(s3.path("out/multipart.parquet")))
    assert through_stager["id"].to_pylist() == list(range(1_500_000))
    assert s3.fs.info(s3.path("out/multipart.parquet"))["size"] == head["ContentLength"]
