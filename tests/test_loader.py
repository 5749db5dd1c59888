"""The Loader against a real cluster: every format, sharding, exact and elastic resume."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from conftest import STORES, assert_store, meta_store_of
from loader_data import (
    file_bytes,
    write_files,
    write_manifest,
    write_parquet,
    write_tar,
    write_zarr,
)

from stager import Client, Loader
from stager.errors import BadRequest, NotFound
from stager.testing import ProcessCluster

FILES = 83
TAR_SHARDS, TAR_PER_SHARD = 3, 29


# Named with an underscore, so that tests/auth/test_loader_auth.py, which imports
# these tests with ``*``, keeps the servers fixture of its own.
@pytest.fixture(scope="module", params=STORES, name="servers")
def _servers_on_each_store(request: pytest.FixtureRequest,
                           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    """The servers in processes of their own (``stager up``): the loader's threads and
    theirs do not share a GIL, as in a real job.  Once with each metadata store (the
    metadata server ``stager up`` starts reads ``STAGER_META_STORE``)."""
    store = meta_store_of(request)
    cluster = ProcessCluster(tmp_path_factory.mktemp("loader-cluster"), data_servers=3,
                             env={"STAGER_META_STORE": store} if store else None)
    cluster.start()
    assert_store(cluster.root, store)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def data(servers: ProcessCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cluster = servers
    c = Client(cluster.meta_url)
    root = "/loader-data"
    out: dict[str, Any] = {"meta": cluster.meta_url, "root": root}
    out["files"] = write_files(c, f"{root}/files", FILES)
    write_files(c, f"{root}/staged", 30)
    write_manifest(c, f"{root}/staged")
    out["tar"] = write_tar(c, f"{root}/tar", TAR_SHARDS, TAR_PER_SHARD)
    out["parquet"] = write_parquet(c, f"{root}/parquet", 2, 250, 40)
    tmp = tmp_path_factory.mktemp("zarr")
    out["zarr"] = write_zarr(c, tmp / "v3", f"{root}/zarr3")
    write_zarr(c, tmp / "v2", f"{root}/zarr2", zarr_format=2)
    write_zarr(c, tmp / "sh", f"{root}/zarrsh", shards=(16, 3, 4))
    c.close()
    return out


def load(data: dict[str, Any], name: str, tmp: Path | None = None, **kw: Any) -> Loader:
    kw.setdefault("batch_size", 8)
    return Loader(f"{data['root']}/{name}", meta_url=data["meta"], index_cache=tmp, **kw)


def indices(batches: list[list[dict[str, Any]]]) -> list[int]:
    return [s["__index__"] for b in batches for s in b]


def test_files_format_every_sample_once(data: dict[str, Any]) -> None:
    with load(data, "files", drop_last=False, prefetch_next_epoch=False) as loader:
        assert loader.format == "files" and len(loader.index) == FILES
        batches = list(loader)
        got = indices(batches)
        assert sorted(got) == list(range(FILES))
        assert got != list(range(FILES))            # shuffled
        for b in batches:
            for s in b:
                i = int(s["__key__"].rsplit("f", 1)[1].split(".")[0])
                assert s["__key__"] == f"d{i // 10}/f{i:04d}.bin"
                assert s["data"] == file_bytes(i)
        stats = loader.stats()
        assert stats["samples"] == FILES and stats["batches"] == len(batches)
        assert stats["bytes"] == sum(len(d) for d in data["files"])
        assert stats["targets"] and all(t["bytes"] > 0 and t["mean_latency"] > 0
                                        for t in stats["targets"].values())
        # small files were coalesced: far fewer requests than files
        assert sum(t["requests"] for t in stats["targets"].values()) < FILES / 2


def test_same_order_on_rerun_and_new_order_next_epoch(data: dict[str, Any]) -> None:
    with load(data, "files", seed=3, drop_last=False) as a, \
            load(data, "files", seed=3, drop_last=False) as b:
        first = indices(list(a))
        assert first == indices(list(b))
        assert a.epoch == 1
        second = indices(list(a))                  # the next epoch, automatically
        assert sorted(second) == sorted(first) and second != first
        b.set_epoch(1)
        assert indices(list(b)) == second


def test_shuffle_false_keeps_manifest_order(data: dict[str, Any]) -> None:
    with load(data, "staged", shuffle=False, drop_last=False) as loader:
        assert loader.index.keys == sorted(loader.index.keys, reverse=True)   # the manifest's
        got = [s["__key__"] for b in loader for s in b]
        assert got == loader.index.keys


def test_manifest_gives_layout_without_stats(data: dict[str, Any]) -> None:
    with load(data, "staged", drop_last=False) as loader:
        assert all(f.checksums and f.layout for f in loader.index.files)
        assert sum(len(b) for b in loader) == 30


def test_stager_url_source(data: dict[str, Any]) -> None:
    host = data["meta"].split("://", 1)[1]
    with Loader(f"stager://{host}{data['root']}/files", batch_size=10) as loader:
        assert len(loader.index) == FILES


def test_tar_samples_are_grouped_by_key(data: dict[str, Any], tmp_path: Path) -> None:
    with load(data, "tar", tmp_path, drop_last=False) as loader:
        assert loader.format == "tar"
        samples = [s for b in loader for s in b]
    assert sorted(s["__key__"] for s in samples) == sorted(data["tar"])
    for s in samples:
        assert s["txt"] == s["__key__"].encode()
        assert s["bin"] == s["__key__"].encode() * 50
        assert data["tar"][s["__index__"]] == s["__key__"]
    assert list(tmp_path.glob("*.json"))               # the shard index was cached


def test_tar_index_fields_are_flat_and_left_alone_by_the_collector(
        data: dict[str, Any], tmp_path: Path) -> None:
    """A sample's fields are one tuple of strings and numbers, which the garbage
    collector stops tracking the first time it sees it: tracked per-sample tuples
    made the oldest generation grow by the index's size, and full collections
    stop every thread."""
    import gc

    with load(data, "tar", tmp_path, drop_last=False) as loader:
        gc.collect(0)
        fields = loader.index.fields
        assert len(fields) == len(data["tar"])
        for f in fields:
            assert len(f) == 6 and set(f[0::3]) == {"bin", "txt"}     # (ext, offset, size) x 2
            assert all(type(x) is int for x in f[1::3] + f[2::3])
            assert not gc.is_tracked(f)


def test_tar_index_cache_is_reused(data: dict[str, Any], tmp_path: Path) -> None:
    from stager.loader.formats import tar

    tar._MEMORY.clear()
    with load(data, "tar", tmp_path) as first:
        counters = first._client.aio.plane.counters
        assert sum(c.requests for c in counters.values()) > 0      # the shards were read
    assert len(list(tmp_path.glob("*.json"))) == TAR_SHARDS
    tar._MEMORY.clear()
    with load(data, "tar", tmp_path) as second:
        counters = second._client.aio.plane.counters
        assert sum(c.requests for c in counters.values()) == 0   # nothing read to index
        assert second.index.keys == first.index.keys


def test_tar_blocks_follow_chunks(data: dict[str, Any], tmp_path: Path) -> None:
    with load(data, "tar", tmp_path) as loader:
        blocks = loader.blocks.tolist()
    assert blocks == [0, TAR_PER_SHARD, 2 * TAR_PER_SHARD]      # one chunk per small shard


@pytest.mark.parametrize("output", ["arrow", "numpy"])
def test_parquet_rows(data: dict[str, Any], output: str) -> None:
    table: pa.Table = data["parquet"]
    with load(data, "parquet", batch_size=32, output=output, drop_last=False) as loader:
        assert loader.format == "parquet" and len(loader.index) == table.num_rows
        assert loader.blocks.tolist() == [0, 40, 80, 120, 160, 200, 240,
                                          250, 290, 330, 370, 410, 450, 490]
        batches = list(loader)
    if output == "arrow":
        assert all(isinstance(b, pa.RecordBatch) for b in batches)
        ids = np.concatenate([b.column("id").to_numpy() for b in batches])
        names = [n for b in batches for n in b.column("name").to_pylist()]
        xs = np.concatenate([b.column("x").to_numpy() for b in batches])
    else:
        ids = np.concatenate([b["id"] for b in batches])
        names = [n for b in batches for n in b["name"]]
        xs = np.concatenate([b["x"] for b in batches])
    assert sorted(ids.tolist()) == list(range(table.num_rows))
    assert names == [f"row{i}" for i in ids]
    assert np.array_equal(xs, ids.astype(np.float32) / 2)


def test_parquet_map_gives_row_dicts(data: dict[str, Any]) -> None:
    with load(data, "parquet", batch_size=16, map=lambda r: (r["id"], r["name"]),
              collate=dict) as loader:
        batch = next(iter(loader))
    assert isinstance(batch, dict) and len(batch) == 16
    assert all(name == f"row{i}" for i, name in batch.items())


@pytest.mark.parametrize("name", ["zarr3", "zarr2", "zarrsh"])
def test_zarr_rows(data: dict[str, Any], name: str) -> None:
    expected: np.ndarray = data["zarr"]
    with load(data, name, batch_size=10, drop_last=False) as loader:
        assert loader.format == "zarr" and len(loader.index) == 103
        rows = 16 if name == "zarrsh" else 8
        assert loader.index.rows == rows
        batches = list(loader)
        order = loader.global_order(0)
    got = np.concatenate(batches)
    assert got.shape == expected.shape and got.dtype == np.float32
    assert np.array_equal(got, expected[order])


def test_map_and_collate_run_in_the_pool(data: dict[str, Any]) -> None:
    import threading

    threads = set()

    def mapper(s: dict[str, Any]) -> int:
        threads.add(threading.current_thread().name)
        return len(s["data"])

    with load(data, "files", map=mapper, collate=sum) as loader:
        sizes = list(loader)
    assert len(sizes) == FILES // 8 and all(isinstance(s, int) for s in sizes)
    assert threads and all(t.startswith("stager-decode") for t in threads)


def run_ranks(data: dict[str, Any], world: int, *, state: dict[str, Any] | None = None,
              steps: int | None = None, **kw: Any) -> tuple[list[list[int]], dict[str, Any]]:
    """Each rank of ``world`` reads ``steps`` batches (all when None) from ``state``."""
    seen, saved = [], {}
    for r in range(world):
        with load(data, "files", rank=r, world_size=world, seed=5, **kw) as loader:
            if state is not None:
                loader.load_state_dict(state)
            got: list[int] = []
            for k, b in enumerate(loader):
                got += [s["__index__"] for s in b]
                if steps is not None and k + 1 == steps:
                    break
            seen.append(got)
            if r == 0:
                saved = loader.state_dict()
    return seen, saved


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_ranks_disjoint_and_complete(data: dict[str, Any], world: int) -> None:
    seen, _ = run_ranks(data, world, batch_size=4, drop_last=False)
    flat = [i for s in seen for i in s]
    assert sorted(flat) == list(range(FILES))
    seen, _ = run_ranks(data, world, batch_size=4, drop_last=True)
    assert len({len(s) for s in seen}) == 1
    flat = [i for s in seen for i in s]
    assert len(flat) == len(set(flat)) == FILES - FILES % (world * 4)


def test_a_state_saved_under_the_older_default_shuffle_resumes_under_it(
        data: dict[str, Any]) -> None:
    """States saved before ``window_of_blocks`` became the default name
    ``block_window``: a loader left on the default resumes them exactly, under
    that order; one given another order refuses them."""
    kw: dict[str, Any] = {"seed": 9, "batch_size": 5, "shuffle_block": 3,
                          "shuffle_window": 7}      # blocks that do not divide windows
    with load(data, "files", order="block_window", **kw) as old:
        everything = [indices([b]) for b in old]
    with load(data, "files", order="block_window", **kw) as old:
        head = [indices([b]) for _, b in zip(range(4), old, strict=False)]
        state = old.state_dict()
    assert state["order"] == "block_window"
    with load(data, "files", **kw) as new:
        assert new.order == "window_of_blocks"
        assert [indices([b]) for b in new] != everything    # the new default differs
        new.load_state_dict(state)
        assert new.order == "block_window"
        assert head + [indices([b]) for b in new] == everything
    with load(data, "files", order="full", **kw) as other:
        with pytest.raises(ValueError, match="order"):
            other.load_state_dict(state)


def test_exact_resume_after_k_batches(data: dict[str, Any]) -> None:
    with load(data, "files", seed=9, batch_size=5) as whole:
        everything = [indices([b]) for b in whole]
    with load(data, "files", seed=9, batch_size=5) as first:
        head = []
        for b in first:
            head.append(indices([b]))
            if len(head) == 7:
                state = first.state_dict()
                break
    assert state["cursor"] == 35 and state["epoch"] == 0
    assert set(state) == {"version", "seed", "epoch", "cursor", "samples", "order",
                          "fingerprint"}
    with load(data, "files", seed=0, batch_size=5) as second:     # seed comes from the state
        second.load_state_dict(state)
        second.set_epoch(0)                    # the usual loop: keeps the resumed position
        tail = [indices([b]) for b in second]
        assert second.state_dict()["epoch"] == 1 and second.state_dict()["cursor"] == 0
    assert head + tail == everything


def test_breaking_off_and_iterating_again_continues(data: dict[str, Any]) -> None:
    with load(data, "files", batch_size=6) as whole:
        everything = indices(list(whole))
    with load(data, "files", batch_size=6) as loader:
        got = []
        for k, b in enumerate(loader):
            got += indices([b])
            if k == 2:
                break
        got += indices(list(loader))
    assert got == everything


@pytest.mark.parametrize(("old", "new"), [(4, 2), (2, 3)])
def test_elastic_resume(data: dict[str, Any], old: int, new: int) -> None:
    before, state = run_ranks(data, old, steps=3, batch_size=4, drop_last=False)
    assert state["cursor"] == 3 * old * 4
    after, _ = run_ranks(data, new, state=state, batch_size=4, drop_last=False)
    flat = [i for s in before + after for i in s]
    assert sorted(flat) == list(range(FILES))       # nothing missed, nothing twice


def test_state_of_another_dataset_is_refused(data: dict[str, Any]) -> None:
    with load(data, "files") as a, load(data, "staged") as b:
        with pytest.raises(ValueError, match="another dataset"):
            b.load_state_dict(a.state_dict())


def test_bad_sources_get_clear_errors(data: dict[str, Any]) -> None:
    with pytest.raises(NotFound):
        load(data, "nope")
    with pytest.raises(BadRequest, match="no .tar shards"):
        load(data, "files", format="tar")
    with pytest.raises(BadRequest, match="not a zarr array"):
        load(data, "files", format="zarr")
    with pytest.raises(ValueError, match="unknown format"):
        load(data, "files", format="csv")
    with pytest.raises(ValueError, match="outside world_size"):
        load(data, "files", rank=2, world_size=2)
    with pytest.raises(ValueError, match="only stager://"):
        Loader("http://x/y", batch_size=1)


def test_importing_the_loader_does_not_import_torch() -> None:
    code = ("import sys, stager, stager.loader; from stager import Loader; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_prefetch_reads_exactly_the_next_batches(data: dict[str, Any]) -> None:
    """With a window of 3 batches, taking batch 0 leads to batches 1..3 being read,
    and nothing else, without the consumer asking."""
    import time

    with load(data, "files", batch_size=5, prefetch_batches=3,
              prefetch_next_epoch=False) as loader:
        order = loader.global_order(0)
        it = iter(loader)
        next(it)
        expected = sum(len(data["files"][int(i)]) for i in order[:4 * 5])
        deadline = time.monotonic() + 10
        while loader.stats()["bytes"] < expected and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)                      # give it the chance to overshoot
        assert loader.stats()["bytes"] == expected
        assert loader.stats()["peak_prefetch_bytes"] <= expected


def test_next_epoch_is_prefetched_and_dropped_when_not_wanted(data: dict[str, Any]) -> None:
    import time

    with load(data, "parquet", batch_size=50, output="numpy", prefetch_batches=2) as loader, \
            load(data, "parquet", batch_size=50, output="numpy") as fresh:
        first = [b["id"].tolist() for b in loader]
        before = loader.stats()["bytes"]
        deadline = time.monotonic() + 10
        while loader.stats()["bytes"] == before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert loader.stats()["bytes"] > before      # epoch 1 is being read ahead
        second = [b["id"].tolist() for b in loader]   # ...and served from that stream
        fresh.set_epoch(1)
        assert second == [b["id"].tolist() for b in fresh] and second != first
        loader.set_epoch(5)                           # elsewhere: the read-ahead is dropped
        fresh.set_epoch(5)
        assert [b["id"].tolist() for b in loader] == [b["id"].tolist() for b in fresh]


def test_zarr_chunks_never_written_read_as_fill_value(servers: ProcessCluster,
                                                      tmp_path: Path) -> None:
    import zarr
    from zarr.storage import LocalStore

    data = np.zeros((40, 3), dtype=np.int32)
    data[20:] = np.arange(60, dtype=np.int32).reshape(20, 3)
    arr = zarr.create_array(LocalStore(tmp_path / "z"), shape=data.shape, chunks=(10, 3),
                            dtype="i4", fill_value=0)
    arr[:] = data
    assert not (tmp_path / "z" / "c" / "0" / "0").exists()   # all fill: zarr skipped it
    with Client(servers.meta_url) as c:
        c.put(tmp_path / "z", "/sparse-zarr")
    with Loader("/sparse-zarr", meta_url=servers.meta_url, batch_size=8, shuffle=False,
                drop_last=False) as loader:
        assert np.array_equal(np.concatenate(list(loader)), data)


def test_empty_files_are_samples_too(servers: ProcessCluster) -> None:
    with Client(servers.meta_url) as c:
        for i, body in enumerate([b"a", b"", b"ccc"]):
            c.pipe(f"/with-empty/f{i}", body)
    with Loader("/with-empty", meta_url=servers.meta_url, batch_size=3,
                shuffle=False) as loader:
        [batch] = list(loader)
    assert [s["data"] for s in batch] == [b"a", b"", b"ccc"]


def _read_in_child(loader: Loader, queue: Any) -> None:
    queue.put(indices(list(loader)))
    loader.close()


def test_a_loader_made_before_fork_reads_in_the_child(data: dict[str, Any]) -> None:
    import multiprocessing as mp

    with load(data, "files", drop_last=False) as loader:
        expected = indices(list(loader))        # the parent read epoch 0 (threads running)
        loader.set_epoch(0)
        ctx = mp.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_read_in_child, args=(loader, queue))
        child.start()
        got = queue.get(timeout=60)
        child.join(30)
        assert child.exitcode == 0 and got == expected
        assert indices(list(loader)) == expected     # the parent's loader still works


def test_spans_cut_fetched_bytes_into_units_with_several_extents_or_none() -> None:
    """A unit may have several extents (a zarr row's chunks) or none (a row never
    written): each unit gets its own, in the order of the units asked for."""
    from stager.loader.spans import Spans
    spans = Spans(np.array([0, 1, 2]), np.zeros(3, dtype=np.int64), np.array([3, 5, 7]),
                  np.array([9, 9, 4]))
    units = np.array([9, 6, 4])
    assert spans.split(units, [b"a", b"b", b"c"]) == [[b"a", b"b"], [], [b"c"]]
    assert spans.unit_sizes(units).tolist() == [8, 0, 7]
    assert spans.of_units(np.array([4])).file.tolist() == [2]


def test_zarr_rows_never_written_read_as_the_fill_value(servers: ProcessCluster,
                                                        tmp_path: Path) -> None:
    import zarr
    from zarr.storage import LocalStore

    data = np.full((40, 3), -1, dtype=np.int32)
    data[:8], data[24:32] = 1, 7        # the other rows' chunks are never written
    arr = zarr.create_array(LocalStore(tmp_path / "z"), shape=data.shape, chunks=(8, 3),
                            dtype="i4", fill_value=-1)
    arr[:8], arr[24:32] = data[:8], data[24:32]
    with Client(servers.meta_url) as c:
        c.put(tmp_path / "z", "/loader-sparse-zarr")
    with Loader("/loader-sparse-zarr", meta_url=servers.meta_url, batch_size=5, seed=4,
                drop_last=False, prefetch_next_epoch=False) as loader:
        order = loader.global_order(0)
        got = np.concatenate(list(loader))
    assert np.array_equal(got, data[order])
