"""Each S3 client's own way to write, list and read an object (its own SigV4 code):
tests/test_s3_auth.py runs it with a good key and with a wrong secret."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stager.testing.s3clients import S3Endpoint


def table(tag: str) -> Any:
    import pyarrow as pa

    return pa.table({"id": list(range(1000)), "tag": [tag] * 1000})


def parquet(tag: str) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table(tag), sink)
    return bytes(sink.getvalue().to_pybytes())


def through(client: str, e: S3Endpoint, folder: str, tmp: Path) -> None:
    """With ``client`` alone: write ``datasets/FOLDER/t.parquet``, list the folder, read
    the file back (each request signed by that client's own SigV4 code)."""
    key = f"{folder}/t.parquet"
    data = parquet(client)
    tmp.mkdir()
    if client == "s3fs":
        fs = e.s3fs()
        fs.pipe(f"datasets/{key}", data)
        assert fs.cat(f"datasets/{key}") == data
        assert [p.rsplit("/", 1)[1] for p in fs.ls(f"datasets/{folder}")] == ["t.parquet"]
    elif client == "pyarrow":
        from pyarrow import fs as pafs

        arrow = e.pyarrow()
        with arrow.open_output_stream(f"datasets/{key}") as out:
            out.write(data)
        with arrow.open_input_stream(f"datasets/{key}") as src:
            assert src.read() == data
        infos = arrow.get_file_info(pafs.FileSelector(f"datasets/{folder}"))
        assert [i.base_name for i in infos] == ["t.parquet"]
    elif client == "polars":
        import polars as pl

        frame = pl.from_arrow(table(client))
        frame.write_parquet(f"s3://datasets/{key}", storage_options=e.polars_options())
        back = pl.scan_parquet(f"s3://datasets/{folder}/*.parquet",
                               storage_options=e.polars_options()).collect()
        assert back.equals(frame)
    elif client == "duckdb":
        con = e.duckdb()
        con.execute(f"COPY (SELECT range AS id, 'duckdb' AS tag FROM range(1000)) "
                    f"TO 's3://datasets/{key}' (FORMAT parquet)")
        assert con.execute(f"SELECT count(*), sum(id) FROM "
                           f"read_parquet('s3://datasets/{folder}/*.parquet')"
                           ).fetchone() == (1000, 499500)
    elif client == "awscli":
        (tmp / "up.parquet").write_bytes(data)
        e.aws("s3", "cp", str(tmp / "up.parquet"), f"s3://datasets/{key}")
        e.aws("s3", "cp", f"s3://datasets/{key}", str(tmp / "down.parquet"))
        assert (tmp / "down.parquet").read_bytes() == data
        listed = e.aws("s3", "ls", f"s3://datasets/{folder}/").stdout
        assert [ln.split()[-1] for ln in listed.splitlines()] == ["t.parquet"]
    else:
        assert client == "rclone"
        (tmp / "up").mkdir()
        (tmp / "up" / "t.parquet").write_bytes(data)
        e.rclone("copy", str(tmp / "up"), f"st:datasets/{folder}")
        e.rclone("copy", f"st:datasets/{folder}", str(tmp / "down"))
        assert (tmp / "down" / "t.parquet").read_bytes() == data
        assert e.rclone("lsf", f"st:datasets/{folder}").stdout.split() == ["t.parquet"]
