"""Real consumers through ``stager://``: pandas and pyarrow (Parquet), zarr v3."""

from __future__ import annotations

import re
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import zarr
from zarr.core.buffer import Buffer, cpu
from zarr.storage import FsspecStore
from zarr.testing.store import StoreTests

from stager.config import load_config
from stager.fs import StagerFileSystem
from stager.testing import ThreadCluster


@pytest.fixture(scope="module")
def fs(cluster: ThreadCluster) -> Iterator[StagerFileSystem]:
    fs = StagerFileSystem(cluster.meta_url, config=load_config(env={}), skip_instance_cache=True)
    yield fs
    fs.close()


def url(cluster: ThreadCluster, path: str) -> str:
    return f"stager://{cluster.meta_url.removeprefix('http://')}{path}"


def sent_bytes(cluster: ThreadCluster) -> int:
    """What every data server says it sent (``stager_sent_bytes_total`` on ``/metrics``)."""
    total = 0.0
    for server in cluster.data:
        assert server is not None
        with urllib.request.urlopen(server.url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        total += sum(float(v) for v in
                     re.findall(r"^stager_sent_bytes_total\{[^}]*\} (\S+)$", text, re.M))
    return int(total)


def frame(rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "part": np.array(["a", "b", "c"])[np.arange(rows) % 3],
        "i": np.arange(rows, dtype=np.int64),
        "x": rng.random(rows),
        "s": [f"row-{k}" for k in range(rows)],
    })


def test_partitioned_dataset_with_pandas_and_pyarrow(cluster: ThreadCluster,
                                                     fs: StagerFileSystem, ns: str) -> None:
    df = frame(30_000)
    target = url(cluster, f"{ns}/pq")
    df.to_parquet(target, partition_cols=["part"], engine="pyarrow",
                  storage_options={"skip_instance_cache": True})
    assert sorted(p.rsplit("/", 2)[1] for p in fs.find(f"{ns}/pq")) == [
        "part=a", "part=b", "part=c"]

    back = pd.read_parquet(target, storage_options={"skip_instance_cache": True})
    back = back.sort_values("i").reset_index(drop=True)
    pd.testing.assert_frame_equal(back[["i", "x", "s"]], df[["i", "x", "s"]])
    assert list(back["part"].astype(str)) == list(df["part"])

    dataset = pads.dataset(f"{ns}/pq", filesystem=fs, format="parquet", partitioning="hive")
    table = dataset.to_table(columns=["i", "x"], filter=pc.field("part") == "b")
    expected = df[df["part"] == "b"]
    assert sorted(table.column("i").to_pylist()) == expected["i"].tolist()
    assert table.num_columns == 2


@pytest.fixture(scope="module")
def wide_file(fs: StagerFileSystem) -> tuple[str, pq.FileMetaData, pa.Table]:
    """Two row groups of six incompressible float columns, about 1 MiB per column chunk."""
    rng = np.random.default_rng(1)
    rows = 2 * 131_072
    table = pa.table({f"c{k}": rng.random(rows) for k in range(6)})
    path = "/parquet-ranges/wide.parquet"
    with fs.open(path, "wb") as f:
        pq.write_table(table, f, row_group_size=rows // 2, compression="none")
    with fs.open(path) as f:
        meta = pq.ParquetFile(f).metadata
    return path, meta, table


def test_a_projected_row_group_fetches_only_its_columns(
        cluster: ThreadCluster, fs: StagerFileSystem, wide_file) -> None:
    path, meta, table = wide_file
    assert meta.num_row_groups == 2
    wanted = ["c1", "c4"]
    group = meta.row_group(1)
    chunk_bytes = sum(group.column(k).total_compressed_size for k in (1, 4))

    # Everything a reader does -- stat, footer, the two column chunks -- counted
    # by what the data servers sent.
    before = sent_bytes(cluster)
    got = pq.ParquetFile(path, filesystem=fs).read_row_group(1, columns=wanted)
    sent = sent_bytes(cluster) - before
    assert got.equals(table.slice(meta.row_group(0).num_rows).select(wanted))
    print(f"row group 1, columns c1+c4: {chunk_bytes} bytes of column chunks, {sent} sent")
    assert chunk_bytes <= sent <= 1.5 * chunk_bytes, (sent, chunk_bytes)

    # The same through a dataset scan with pre-buffering (pyarrow's default).
    before = sent_bytes(cluster)
    scanned = pads.dataset(path, filesystem=fs, format="parquet").to_table(
        columns=wanted, filter=pc.field("c0") < 2.0,
        fragment_scan_options=pads.ParquetFragmentScanOptions(pre_buffer=True))
    sent = sent_bytes(cluster) - before
    assert scanned.num_rows == table.num_rows
    all_chunks = sum(meta.row_group(g).column(k).total_compressed_size
                     for g in (0, 1) for k in (0, 1, 4))        # the filter reads c0 too
    print(f"dataset scan c0 (filter) + c1 + c4: {all_chunks} bytes of column chunks, {sent} sent")
    assert all_chunks <= sent <= 1.5 * all_chunks, (sent, all_chunks)


def test_zarr_arrays_through_stager(cluster: ThreadCluster, fs: StagerFileSystem,
                                    ns: str) -> None:
    store_url = url(cluster, f"{ns}/arrays.zarr")
    opts = {"skip_instance_cache": True}
    data = np.arange(200 * 300, dtype="f8").reshape(200, 300)
    z = zarr.open_array(store_url, mode="w", shape=data.shape, chunks=(64, 64), dtype="f8",
                        storage_options=opts)
    z[:] = data
    z[10:20, 10:20] = -1.0
    data[10:20, 10:20] = -1.0
    back = zarr.open_array(store_url, mode="r", storage_options=opts)
    assert back.shape == (200, 300)
    np.testing.assert_array_equal(back[:], data)
    np.testing.assert_array_equal(back[150:190, 7:260], data[150:190, 7:260])
    assert fs.exists(f"{ns}/arrays.zarr/zarr.json")
    assert len(fs.find(f"{ns}/arrays.zarr/c")) == 4 * 5            # one object per chunk

    group = zarr.open_group(url(cluster, f"{ns}/group.zarr"), mode="w", storage_options=opts)
    labels = group.create_array("labels", shape=(1000,), chunks=(100,), dtype="i4")
    labels[:] = np.arange(1000, dtype="i4")
    reopened = zarr.open_group(url(cluster, f"{ns}/group.zarr"), mode="r",
                               storage_options=opts)
    np.testing.assert_array_equal(reopened["labels"][::7], np.arange(1000, dtype="i4")[::7])
    assert list(reopened.array_keys()) == ["labels"]


# -- zarr's own store conformance suite, over stager:// ------------------------------------
class TestZarrFsspecStoreOnStager(StoreTests[FsspecStore, cpu.Buffer]):
    """zarr's ``StoreTests`` against its ``FsspecStore`` backed by ``StagerFileSystem``."""

    store_cls = FsspecStore
    buffer_cls = cpu.Buffer

    @pytest.fixture
    async def store_kwargs(self, cluster: ThreadCluster) -> AsyncIterator[dict[str, Any]]:
        # Cached (not skip_instance_cache), so that an unpickled store has an equal fs.
        fs = StagerFileSystem(cluster.meta_url, config=load_config(env={}), asynchronous=True)
        yield {"fs": fs, "path": f"/zarr-store-{uuid.uuid4().hex[:10]}", "read_only": False}
        await fs.aclose()      # while this test's loop still runs

    async def set(self, store: FsspecStore, key: str, value: Buffer) -> None:
        await store.fs._pipe_file(f"{store.path}/{key}", value.to_bytes())

    async def get(self, store: FsspecStore, key: str) -> Buffer:
        return self.buffer_cls.from_bytes(await store.fs._cat_file(f"{store.path}/{key}"))

    def test_store_repr(self, store: FsspecStore) -> None:
        assert repr(store) == f"<FsspecStore(StagerFileSystem, {store.path})>"

    def test_store_supports_writes(self, store: FsspecStore) -> None:
        assert store.supports_writes

    def test_store_supports_listing(self, store: FsspecStore) -> None:
        assert store.supports_listing
