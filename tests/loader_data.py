"""Small datasets of every format, written into a real cluster, for the loader tests."""

from __future__ import annotations

import io
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from stager import Client
from stager.protocol.manifest import Manifest, ManifestFile


def file_bytes(i: int, size: int = 1000) -> bytes:
    return (f"sample-{i:05d}:".encode() * (size // 13 + 1))[:size + i % 7]


def write_files(client: Client, path: str, n: int, size: int = 1000) -> list[bytes]:
    """``n`` files ``d<i // 10>/f<i>.bin`` under ``path`` (written in parallel)."""
    data = [file_bytes(i, size) for i in range(n)]
    with tempfile.TemporaryDirectory() as tmp:
        for i, d in enumerate(data):
            local = Path(tmp) / f"d{i // 10}" / f"f{i:04d}.bin"
            local.parent.mkdir(exist_ok=True)
            local.write_bytes(d)
        client.put(tmp, path, files_in_flight=16)
    return data


def write_manifest(client: Client, path: str) -> None:
    """Record a manifest listing the files in *reverse* name order (so a test can
    tell that the manifest's order, not the listing's, was used)."""
    entries = sorted(client.walk(path), key=lambda e: e.path, reverse=True)
    files = tuple(ManifestFile(e.path[len(path) + 1:], e.size, e.mtime, e.file_id or "")
                  for e in entries)
    client.put_manifest(Manifest(path, files, source="test", created=time.time()))


def tar_shard(keys: list[str], fields: dict[str, callable]) -> bytes:  # type: ignore[valid-type]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for key in keys:
            for ext, make in fields.items():
                data = make(key)
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_tar(client: Client, path: str, shards: int, per_shard: int) -> list[str]:
    keys = []
    for s in range(shards):
        ks = [f"shard{s}/sample{i:04d}" for i in range(per_shard)]
        keys += ks
        client.pipe(f"{path}/part-{s:03d}.tar", tar_shard(ks, {
            "txt": lambda k: k.encode(),
            "bin": lambda k: k.encode() * 50,
        }))
    return keys


def write_parquet(client: Client, path: str, files: int, rows: int,
                  row_group: int) -> pa.Table:
    tables = []
    for f in range(files):
        start = f * rows
        t = pa.table({"id": np.arange(start, start + rows, dtype=np.int64),
                      "x": np.arange(start, start + rows, dtype=np.float32) / 2,
                      "name": [f"row{i}" for i in range(start, start + rows)]})
        buf = io.BytesIO()
        pq.write_table(t, buf, row_group_size=row_group)
        client.pipe(f"{path}/part-{f}.parquet", buf.getvalue())
        tables.append(t)
    return pa.concat_tables(tables)


def write_zarr(client: Client, local: Path, path: str, *, zarr_format: int = 3,
               shards: tuple[int, ...] | None = None) -> np.ndarray:
    import zarr
    from zarr.storage import LocalStore

    data = np.arange(103 * 3 * 4, dtype=np.float32).reshape(103, 3, 4)
    kwargs = {"shards": shards} if shards else {}
    arr = zarr.create_array(LocalStore(local), shape=data.shape, chunks=(8, 3, 2),
                            dtype="f4", zarr_format=zarr_format, **kwargs)
    arr[:] = data
    client.put(local, path)
    return data
