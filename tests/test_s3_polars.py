"""polars (its own Rust ``object_store`` S3 client) against stager's S3 endpoint.

``scan_parquet`` over an ``s3://`` glob and a hive-partitioned folder lists and
reads with ranged GETs, projection and predicate pushed down; ``write_parquet``
to ``s3://`` lands byte-exact in ``stager://``.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stager.testing.s3clients import S3Stack, s3_stack

pytestmark = pytest.mark.slow      # stager up as a subprocess

FILES, ROWS = 4, 25_000


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Stack]:
    with s3_stack(tmp_path_factory.mktemp("s3-polars"), bucket="polars") as stack:
        yield stack


def frame(rows: int, first: int = 0) -> pl.DataFrame:
    return pl.DataFrame({"id": pl.int_range(first, first + rows, eager=True),
                         "k": pl.int_range(first, first + rows, eager=True) % 5,
                         "v": pl.int_range(first, first + rows, eager=True) * 0.25})


def test_scan_parquet_glob_of_what_stager_wrote(s3: S3Stack) -> None:
    for i in range(FILES):
        with s3.fs.open(s3.path(f"in/p{i}.parquet"), "wb") as f:
            pq.write_table(frame(ROWS, i * ROWS).to_arrow(), f, row_group_size=5000)

    lazy = pl.scan_parquet(s3.url("in/*.parquet"), storage_options=s3.endpoint.polars_options())
    whole = lazy.sort("id").collect()
    assert whole.equals(frame(FILES * ROWS))

    picked = lazy.filter(pl.col("k") == 3).select(pl.len(), pl.col("v").sum()).collect()
    expected = frame(FILES * ROWS).filter(pl.col("k") == 3)
    assert picked.row(0) == (expected.height, expected["v"].sum())


@pytest.mark.parametrize("checksum", [pytest.param(None, id="default"), "sha256"])
def test_write_parquet_to_s3_lands_in_stager(s3: S3Stack, checksum: str | None) -> None:
    """polars as it comes (an x-amz-checksum-crc64nvme header on each upload) and with
    SHA-256."""
    df = frame(10_000)
    options = s3.endpoint.polars_options(checksum)
    out = f"out-{checksum or 'default'}"
    df.write_parquet(s3.url(f"{out}/one.parquet"), storage_options=options)
    raw = s3.fs.cat_file(s3.path(f"{out}/one.parquet"))
    assert pl.read_parquet(raw).equals(df)
    assert pl.read_parquet(s3.url(f"{out}/one.parquet"), storage_options=options).equals(df)

    df.write_parquet(s3.url(f"{out}/hive/"), storage_options=options, partition_by="k")
    hive = s3.path(f"{out}/hive/")
    parts = sorted(p.removeprefix(hive) for p in s3.fs.find(hive))
    assert [p.split("/")[0] for p in parts] == [f"k={k}" for k in range(5)]
    back = pl.scan_parquet(s3.url(f"{out}/hive/"), storage_options=options,
                           hive_partitioning=True).collect()
    assert back.select("id", "k", "v").sort("id").equals(
        df.with_columns(pl.col("k").cast(back.schema["k"])))


def test_arrow_table_through_s3_equals_stager(s3: S3Stack) -> None:
    table = pa.table({"x": list(range(3000)), "s": [str(i) for i in range(3000)]})
    with s3.fs.open(s3.path("arrow/t.parquet"), "wb") as f:
        pq.write_table(table, f)
    through_s3 = pl.read_parquet(s3.url("arrow/t.parquet"),
                                 storage_options=s3.endpoint.polars_options())
    assert through_s3.to_arrow().equals(pl.from_arrow(table).to_arrow())

