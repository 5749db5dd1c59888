"""pandas and pyarrow on stager through fsspec: a partitioned Parquet dataset on ``stager://``.

    python clients/fsspec_pandas.py [META_URL]

Writes a small partitioned dataset with ``DataFrame.to_parquet``, reads it back
with ``pandas.read_parquet``, then runs a projected, filtered query with
``pyarrow.dataset`` and shows what ``info`` says of one file (size, whole-file
CRC32C, layout).  META_URL defaults to $STAGER_META_URL, else
http://127.0.0.1:7070.  Every step checks its result; the script exits non-zero
on any failure and removes what it wrote.
"""

from __future__ import annotations

import os
import sys
import uuid

import fsspec
import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pyarrow.dataset as ds

DEFAULT_META_URL = "http://127.0.0.1:7070"


def main(meta_url: str) -> int:
    netloc = meta_url.removeprefix("http://").rstrip("/")
    # stager://HOST:PORT/path names the cluster; stager:///path would use $STAGER_META_URL
    url = f"stager://{netloc}/examples/pandas-{uuid.uuid4().hex[:8]}/events"
    rng = np.random.default_rng(0)
    df = pd.DataFrame({
        "split": np.where(np.arange(50_000) % 10 == 0, "val", "train"),
        "id": np.arange(50_000, dtype=np.int64),
        "score": rng.random(50_000),
        "label": rng.integers(0, 10, 50_000),
    })

    # 1. write: one directory per partition value, files streamed chunk by chunk
    df.to_parquet(url, partition_cols=["split"], engine="pyarrow")
    fs, root = fsspec.url_to_fs(url)
    files = fs.find(root)
    print(f"1. wrote {len(files)} Parquet file(s) under {url}")
    check(sorted({f.split("/")[-2] for f in files}) == ["split=train", "split=val"],
          "partition directories are missing")

    # 2. read back whole with pandas
    back = pd.read_parquet(url).sort_values("id").reset_index(drop=True)
    check(back[["id", "score", "label"]].equals(df[["id", "score", "label"]]),
          "the dataset read back differs")
    print(f"2. pandas.read_parquet: {len(back)} rows, identical")

    # 3. a query: two columns, one partition, a filter pushed into the scan
    dataset = ds.dataset(root, filesystem=fs, format="parquet", partitioning="hive")
    table = dataset.to_table(columns=["id", "score"],
                             filter=(pc.field("split") == "val") & (pc.field("score") > 0.5))
    expected = df[(df["split"] == "val") & (df["score"] > 0.5)]
    check(sorted(table.column("id").to_pylist()) == expected["id"].tolist(),
          "the filtered query returned the wrong rows")
    print(f"3. pyarrow.dataset query: {table.num_rows} rows of {table.column_names}")

    # 4. what stager knows of a file
    info = fs.info(files[0])
    layout = info["layout"]
    print(f"4. {info['name']}: {info['size']} bytes, {info['checksum']}, chunks of "
          f"{layout['chunk_size']} over {layout['stripe_count']} target(s)")

    fs.rm(root.rsplit("/", 1)[0], recursive=True)
    check(not fs.exists(root), "clean-up failed")
    print("ok")
    return 0


def check(condition: bool, message: str) -> None:
    if not condition:
        print(f"FAILED: {message}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("STAGER_META_URL",
                                                               DEFAULT_META_URL)
    raise SystemExit(main(url))
