"""Mosaic Streaming (``mosaicml-streaming``) against stager's S3 endpoint.

Mosaic runs in a venv of its own (``.venv-mosaic``: it pins ``numpy<2.2`` and needs
torchvision beside a CUDA build of torch) as a subprocess, told the endpoint as its
users do, ``S3_ENDPOINT_URL`` with ``s3://`` remotes (:mod:`stager.testing.mosaic`).
On a real ``stager up --s3-port 0`` cluster: ``MDSWriter(out=(local, "s3://…"))``
uploads each shard and the index as it closes them, and what it uploaded reads back
through ``stager://`` byte-exact to its local copy; ``StreamingDataset(remote=
"s3://…", shuffle=True)`` downloads the shards (GetObject) and yields every sample,
once, with its bytes, both of what Mosaic uploaded and of MDS shards that stager's
own client wrote.  Mosaic records each shard's SHA-1 in ``index.json``
(``hashes=["sha1"]``) and checks it on download (``validate_hash``).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stager.testing.mosaic import mosaic_python, run_jobs
from stager.testing.s3clients import ClientMissing, S3Stack, read_dir, s3_stack

pytestmark = pytest.mark.slow      # stager up and Mosaic as subprocesses

BUCKET = "mosaic"
BATCH = 32


@pytest.fixture(scope="module")
def python() -> str:
    try:
        return mosaic_python()
    except ClientMissing as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def s3(python: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Stack]:
    with s3_stack(tmp_path_factory.mktemp("s3-mosaic"), bucket=BUCKET) as stack:
        yield stack


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[int, bytes]]]:
    """1,500 samples from empty to 200 KB (a few big ones, so a shard of Mosaic's
    ``size_limit`` of 1 MiB holds from a handful of samples to hundreds), pickled for
    the writer."""
    rng = random.Random(29)
    sizes = [0, 1, 4095, 4096, 200_000] + [rng.choice((rng.randrange(1, 3000),
                                                       rng.randrange(1, 40_000)))
                                           for _ in range(1495)]
    data = [(i, rng.randbytes(size)) for i, size in enumerate(sizes)]
    path = tmp_path_factory.mktemp("mosaic-samples") / "samples.pickle"
    path.write_bytes(pickle.dumps(data))
    return path, data


@dataclass
class Runs:
    """What the two Mosaic processes of the module did (``import streaming`` costs
    seconds, so each runs several steps)."""

    uploaded: Path                  # MDSWriter's local copy of what it uploaded
    put: dict[str, bytes]           # MDS shards written locally, put through stager
    from_upload: list[tuple[int, bytes]]     # StreamingDataset's samples, in its order
    from_put: list[tuple[int, bytes]]
    put_cache: Path                 # where StreamingDataset kept the shards of ``put``


@pytest.fixture(scope="module")
def runs(s3: S3Stack, samples: tuple[Path, list[tuple[int, bytes]]],
         tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """First process: MDSWriter to a local folder and ``s3://mosaic/written`` (zstd, the
    SHA-1 of each shard in the index), and to a local folder only (uncompressed), which
    stager's client puts at ``/mosaic/put``.  Second: a shuffled epoch of
    ``StreamingDataset`` over each remote, the first with two (spawned) DataLoader workers
    and each shard's SHA-1 checked on download, the second in one process."""
    tmp = tmp_path_factory.mktemp("mosaic")
    source = str(samples[0])
    written = run_jobs([
        ("write", {"samples": source, "out": [str(tmp / "written"), s3.url("written")],
                   "keep_local": True, "size_limit": 1 << 20, "compression": "zstd",
                   "hashes": ["sha1"]}),
        ("write", {"samples": source, "out": str(tmp / "put"), "size_limit": 1 << 20}),
    ], s3.endpoint)
    assert written == [{"written": len(samples[1])}] * 2
    put = read_dir(tmp / "put")
    s3.put_tree("put", put)

    def read(remote: str, name: str, **spec: object) -> tuple[str, dict[str, object]]:
        return ("read", {"remote": remote, "local": str(tmp / f"cache-{name}"),
                         "batch_size": BATCH, "shuffle": True,
                         "into": str(tmp / f"{name}.pickle"), **spec})

    # spawned workers: forked ones share the parent's boto3 keep-alive connections (see
    # bench/bench_mosaic.py's notes: stalls of Mosaic's 60 s download timeout, garbled shards)
    counts = run_jobs([read(s3.url("written"), "written", workers=2, context="spawn",
                            validate_hash="sha1"),
                       read(s3.url("put"), "put", workers=0)], s3.endpoint)
    got = [pickle.loads((tmp / f"{name}.pickle").read_bytes()) for name in ("written", "put")]
    assert counts == [{"read": len(g)} for g in got]
    return Runs(tmp / "written", put, got[0], got[1], tmp / "cache-put")


def assert_every_sample(got: list[tuple[int, bytes]], data: list[tuple[int, bytes]]) -> None:
    assert len(got) == len(data)
    assert [i for i, _ in got] != [i for i, _ in data], "shuffle=True read in written order"
    by_id = dict(got)
    assert len(by_id) == len(data), "a sample came twice"
    bad = [i for i, blob in data if by_id.get(i) != blob]
    assert not bad, f"{len(bad)} samples differ, the first ids: {bad[:10]}"


def test_writer_uploads_shards_that_read_back_through_stager(s3: S3Stack, runs: Runs) -> None:
    """What MDSWriter uploaded (boto3's ``upload_file``) is its local copy, byte for
    byte, and every shard's SHA-1 is the one Mosaic put in the index."""
    local = read_dir(runs.uploaded)
    assert "index.json" in local and len(local) > 5, sorted(local)
    assert s3.read_tree("written") == local

    index = json.loads(local["index.json"])
    for shard in index["shards"]:
        zipped = shard["zip_data"]
        blob = s3.fs.cat_file(s3.path(f"written/{zipped['basename']}"))
        assert len(blob) == zipped["bytes"]
        assert hashlib.sha1(blob).hexdigest() == zipped["hashes"]["sha1"]


def test_streaming_dataset_reads_every_sample_mosaic_uploaded(
        runs: Runs, samples: tuple[Path, list[tuple[int, bytes]]]) -> None:
    """zstd shards downloaded through the S3 remote with two DataLoader workers."""
    assert_every_sample(runs.from_upload, samples[1])


def test_streaming_dataset_reads_shards_stager_wrote(
        runs: Runs, samples: tuple[Path, list[tuple[int, bytes]]]) -> None:
    """MDS shards put into the cluster by stager's own client, streamed over S3."""
    assert_every_sample(runs.from_put, samples[1])
    # Mosaic keeps what it downloaded (no cache_limit): every shard, stager's bytes
    cache = read_dir(runs.put_cache)
    shards = {n for n in runs.put if n.endswith(".mds")}
    assert len(shards) > 5 and shards <= set(cache), sorted(cache)
    assert all(cache[n] == runs.put[n] for n in shards)
