"""stager.torch: DataLoader with workers (forked), ranks from torch.distributed, resume,
and the device feeder (CPU path here; the CUDA path is in test_torch_gpu.py)."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from loader_data import write_files, write_zarr

from stager import Client
from stager.loader.workers import usable_cores, workers_pay
from stager.testing import ProcessCluster

pytestmark = pytest.mark.slow      # stager processes, DataLoader workers: not in make check

torch = pytest.importorskip("torch")
from stager.torch import (  # noqa: E402
    DeviceFeeder,
    SharedBatch,
    StagerDataLoader,
    StagerDataset,
    dist_rank_world,
    to_tensors,
)

N = 61


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Servers in processes of their own: DataLoader workers fork this process."""
    cluster = ProcessCluster(tmp_path_factory.mktemp("torch-cluster"), data_servers=2)
    cluster.start()
    try:
        with Client(cluster.meta_url) as c:
            write_files(c, "/torch-ds/files", N, size=300)
            write_zarr(c, tmp_path_factory.mktemp("z") / "a", "/torch-ds/zarr")
        yield {"meta": cluster.meta_url}
    finally:
        cluster.stop()


def keys_of(batch: list[dict[str, Any]]) -> list[int]:
    return [int(s["__index__"]) for s in batch]


@pytest.fixture
def make(ds: dict[str, Any]) -> Iterator[Callable[..., StagerDataset]]:
    """Datasets over /torch-ds/files, closed after the test."""
    made: list[StagerDataset] = []

    def one(path: str = "/torch-ds/files", **kw: Any) -> StagerDataset:
        kw.setdefault("batch_size", 4)
        kw.setdefault("drop_last", False)
        kw.setdefault("seed", 2)
        made.append(StagerDataset(path, meta_url=ds["meta"], **kw))
        return made[-1]

    yield one
    for d in made:
        d.close()


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_dataloader_workers_read_every_sample_once_in_order(make: Any, workers: int) -> None:
    data = make()
    expected = [keys_of(b) for b in data.loader.for_worker(0, 1)]
    dl = StagerDataLoader(data, fallback=False, num_workers=workers, multiprocessing_context="fork"
                          if workers else None)
    got = [keys_of(b) for b in dl]
    assert got == expected                           # same batches, same order
    assert sorted(i for b in got for i in b) == list(range(N))
    assert len(dl) == len(expected)


@pytest.mark.parametrize("share", [True, "copy", False])
def test_worker_batches_arrive_whole(make: Any, share: bool | str) -> None:
    """Every field of every sample, the bytes included, as the loader in this process
    makes them: views of shared memory, copied out of it, or pickled.  Every batch
    is kept here, so the workers never get a buffer back: none is overwritten."""
    data = make()
    expected = list(data.loader.for_worker(0, 1))
    got = list(StagerDataLoader(data, fallback=False, num_workers=2, multiprocessing_context="fork",
                                share_bytes=share))
    assert got == expected
    assert {type(s["data"]) for b in got for s in b} == \
        {memoryview if share is True else bytes}
    assert sum(len(s["data"]) for b in got for s in b) >= 300 * N
    assert all(list(s) == list(e) for b, c in zip(got, expected, strict=True)
               for s, e in zip(b, c, strict=True))         # keys in the same order


def _tag(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(s, size=len(s["data"]), head=s["data"][:4]) for s in batch]


def test_a_collate_fn_runs_in_the_worker_before_the_batch_is_shared(make: Any) -> None:
    data = make()
    expected = [_tag(b) for b in data.loader.for_worker(0, 1)]
    got = list(StagerDataLoader(data, fallback=False, num_workers=2, multiprocessing_context="fork",
                                collate_fn=_tag))
    assert got == expected


def test_workers_reuse_their_shared_buffers(make: Any) -> None:
    """The main process hands each buffer back once it has copied it out, and the
    worker fills it again: many batches, few buffers, each sent across once."""
    data = make(batch_size=1)           # 61 batches
    dl = StagerDataLoader(data, fallback=False, num_workers=2, multiprocessing_context="fork")
    data.loader.begin_pass()
    mapped: dict[tuple[int, int], Any] = {}
    sent, samples, workers = 0, [], set()
    for batch in torch.utils.data.DataLoader.__iter__(dl):  # as they come from workers
        assert type(batch) is SharedBatch and batch.slot >= 0
        workers.add(batch.worker)
        sent += batch.data is not None
        samples += batch.unpack(mapped, copy=True)
    assert sorted(int(s["__index__"]) for s in samples) == list(range(N))
    assert all(type(s["data"]) is bytes for s in samples)
    assert workers == {0, 1}
    assert 2 <= sent <= 2 * 16 < N      # a buffer's handle crosses once, then its slot


def test_batches_are_views_of_the_workers_shared_buffers(make: Any) -> None:
    """No copy in the main process: a sample's bytes are a read-only view of the
    worker's shared-memory buffer, and once the batch is dropped the buffer goes
    back to the worker, which fills it again (few buffers for many batches)."""
    data = make(batch_size=1)           # 61 batches
    expected = {int(b[0]["__index__"]): bytes(b[0]["data"])
                for b in data.loader.for_worker(0, 1)}
    buffers, seen = set(), []
    for batch in StagerDataLoader(data, fallback=False, num_workers=2,
                                  multiprocessing_context="fork"):
        view = batch[0]["data"]
        assert type(view) is memoryview and view.readonly
        array = view.obj                    # the batch's array over the buffer
        assert isinstance(array, np.ndarray) and isinstance(array.base, torch.Tensor)
        assert array.base.is_shared()       # the worker's pages, mapped here
        start = array.ctypes.data
        address = np.frombuffer(view, dtype=np.uint8).ctypes.data
        assert start <= address < start + len(array)        # inside it: not copied
        buffers.add(array.base.data_ptr())
        seen.append(int(batch[0]["__index__"]))
        assert bytes(view) == expected[seen[-1]]
        del batch, view, array
    assert sorted(seen) == list(range(N))
    assert len(buffers) <= 2 * 4 < N        # handed back and reused


def test_workers_read_runs_of_steps_in_turn_and_share_one_plan(make: Any) -> None:
    """Each worker reads whole runs of consecutive steps (its fetch groups are a
    shuffle window's, not every other batch of it); together they read every step
    of the pass exactly once, and the main process hands them out in plan order."""
    from stager.loader.workers import worker_steps
    data = make(batch_size=2)
    plan = [keys_of(b) for b in data.loader.for_worker(0, 1)]
    dl = StagerDataLoader(data, fallback=False, num_workers=2, multiprocessing_context="fork")
    run = dl.run
    assert run >= 2
    parts = [[keys_of(b) for b in data.loader.for_worker(w, 2, run)] for w in (0, 1)]
    steps = [worker_steps(len(plan), w, 2, run) for w in (0, 1)]
    assert steps[0][:run] == list(range(run))       # a run, then the other worker's
    assert steps[1][0] == run
    assert sorted(steps[0] + steps[1]) == list(range(len(plan)))
    assert parts == [[plan[i] for i in s] for s in steps]
    assert [keys_of(b) for b in dl] == plan
    # a plain DataLoader over the same dataset afterwards: bare batches, round-robin
    plain = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2,
                                        multiprocessing_context="fork")
    got = [keys_of(b) for b in plain]               # (the next epoch: another order)
    assert sorted(i for b in got for i in b) == sorted(i for b in plan for i in b)


def test_counting_batches_handed_out_does_not_plan_the_pass_again(
        make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The main process counts every batch (advance); planning a pass is O(its
    batches), so it is planned once a pass, not once a batch (O(n²) an epoch)."""
    from stager.loader import loader as loader_module
    calls = []
    plan = loader_module.PARTITIONS["interleaved"]

    def counted(*args: Any) -> Any:
        calls.append(args)
        return plan(*args)

    monkeypatch.setitem(loader_module.PARTITIONS._policies, "interleaved", counted)
    data = make(batch_size=1)
    loader = data.loader
    steps = loader.begin_pass()
    assert steps == N
    for _ in range(steps):
        loader.advance()
    assert len(calls) <= 2
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["cursor"] == 0


def test_shared_batch_packs_only_lists_of_sample_dicts() -> None:
    batch = [{"__key__": "a", "__index__": 0, "jpg": b"x" * 10, "cls": b"7", "n": 3},
             {"__key__": "b", "__index__": 1, "jpg": b"", "cls": b"8", "n": 4}]
    copy = [dict(s) for s in batch]
    packed = SharedBatch.pack(batch)
    assert type(packed) is SharedBatch and packed.data.is_shared()
    assert batch == copy                            # the worker's own batch is untouched
    out = packed.unpack()
    assert out == copy and [list(s) for s in out] == [list(s) for s in copy]
    assert all(type(s["jpg"]) is memoryview for s in out)
    assert SharedBatch.pack(batch).unpack(copy=True) == copy
    assert all(type(s["jpg"]) is bytes for s in SharedBatch.pack(batch).unpack(copy=True))
    for other in ([1, 2], [{"n": 1}], np.arange(3), {"jpg": b"x"}, [], ([{"a": b"x"}],),
                  [{"a": b""}]):
        assert SharedBatch.pack(other) is other


def test_shared_buffers_are_reused_grown_and_never_overwritten_while_busy() -> None:
    from stager.loader.torchshare import Slots
    slots = Slots(worker=0)
    j, first, new = slots.take(100)
    assert (j, new) == (0, True) and len(first) >= 100
    slots.busy.numpy()[j] = 0                       # the main process is done with it
    again, same, new = slots.take(90)
    assert (again, new) == (0, False) and same.data_ptr() == first.data_ptr()
    taken = {again}
    for _ in range(slots.COUNT - 1):                # nothing handed back: all new ones
        k, _, new = slots.take(100)
        assert k not in taken and new
        taken.add(k)
    overflow, own, new = slots.take(100)            # every buffer busy: one of its own
    assert (overflow, new) == (-1, True) and own.is_shared()
    slots.busy.numpy()[3] = 0
    k, bigger, new = slots.take(10_000)             # a free one, made big enough
    assert (k, new) == (3, True) and len(bigger) >= 10_000


def test_plain_dataloader_with_two_workers(make: Any) -> None:
    data = make()
    dl = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2,
                                     multiprocessing_context="fork")
    got = [i for b in dl for i in keys_of(b)]
    assert sorted(got) == list(range(N))


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_ranks_and_workers_together(make: Any, world: int) -> None:
    seen = []
    for rank in range(world):
        data = make(rank=rank, world_size=world, batch_size=2)
        dl = StagerDataLoader(data, fallback=False, num_workers=2, multiprocessing_context="fork")
        seen += [i for b in dl for i in keys_of(b)]
    assert sorted(seen) == list(range(N))           # no duplicate across ranks or workers


def test_resume_through_the_dataloader(make: Any) -> None:
    whole = [keys_of(b) for b in StagerDataLoader(make(), fallback=False, num_workers=2,
                                                  multiprocessing_context="fork")]
    dl = StagerDataLoader(make(), fallback=False, num_workers=2, multiprocessing_context="fork")
    head = []
    for b in dl:
        head.append(keys_of(b))
        if len(head) == 5:
            state = dl.state_dict()
            break
    assert state["cursor"] == 20
    again = StagerDataLoader(make(), fallback=False, num_workers=2, multiprocessing_context="fork")
    again.load_state_dict(state)
    tail = [keys_of(b) for b in again]
    assert head + tail == whole
    assert again.state_dict()["epoch"] == 1 and again.state_dict()["cursor"] == 0


def test_spawned_workers_get_a_picklable_dataset(make: Any) -> None:
    dl = StagerDataLoader(make(), fallback=False, num_workers=1, multiprocessing_context="spawn")
    assert sorted(i for b in dl for i in keys_of(b)) == list(range(N))


# The dataset is never closed, as in most training scripts; ResourceWarnings are shown.
EPOCH = r"""
import sys, warnings
warnings.filterwarnings("ignore", "This DataLoader will create")
from stager.torch import StagerDataLoader, StagerDataset
meta, path = sys.argv[1:3]
ds = StagerDataset(path, meta_url=meta, batch_size=4, drop_last=False)
print(sum(len(b) for b in StagerDataLoader(ds, fallback=False, num_workers=2,
                                          multiprocessing_context="fork")))
"""


def test_an_epoch_with_workers_leaves_stderr_clean(ds: dict[str, Any]) -> None:
    """Each process closes the sessions it opened (the main one at exit) and no worker
    touches the parent's: no "Unclosed client session" or "Unclosed connector"."""
    out = subprocess.run([sys.executable, "-W", "always::ResourceWarning", "-c", EPOCH,
                          ds["meta"], "/torch-ds/files"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(N)]
    assert "Unclosed" not in out.stderr, out.stderr
    assert out.stderr == ""


def test_persistent_workers_are_refused(make: Any) -> None:
    with pytest.raises(ValueError, match="persistent_workers"):
        StagerDataLoader(make(), fallback=False, num_workers=1, persistent_workers=True)


def _rank_main(rank: int, init: str, meta: str, queue: Any) -> None:
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        with StagerDataset("/torch-ds/files", meta_url=meta, batch_size=4, seed=2,
                           drop_last=True) as data:
            queue.put((rank, data.loader.rank, data.loader.world_size,
                       [i for b in data for i in keys_of(b)]))
    finally:
        torch.distributed.destroy_process_group()


def test_rank_and_world_size_come_from_torch_distributed(ds: dict[str, Any],
                                                         tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [ctx.Process(target=_rank_main, args=(r, init, ds["meta"], queue))
             for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert [(r, lr, w) for r, lr, w, _ in results] == [(0, 0, 2), (1, 1, 2)]
    a, b = results[0][3], results[1][3]
    assert len(a) == len(b) == (N - N % 8) // 2 and not set(a) & set(b)


def test_dist_rank_world_without_distributed() -> None:
    assert dist_rank_world() == (0, 1)
    assert dist_rank_world(3, 4) == (3, 4)


def test_device_feeder_cpu_path_gives_tensors(make: Any) -> None:
    data = make("/torch-ds/zarr", batch_size=10, shuffle=False)
    batches = list(DeviceFeeder(StagerDataLoader(data), device="cpu"))
    assert all(isinstance(b, torch.Tensor) and b.dtype == torch.float32 for b in batches)
    got = torch.cat(batches).numpy()
    assert np.array_equal(got, np.arange(103 * 12, dtype=np.float32).reshape(103, 3, 4))


def test_to_tensors_keeps_bytes_and_converts_numbers() -> None:
    import pyarrow as pa

    rb = pa.RecordBatch.from_pydict({"a": [1, 2], "s": ["x", "y"]})
    out = to_tensors({"b": b"raw", "n": np.arange(3), "rb": rb, "l": [np.ones(2)]})
    assert out["b"] == b"raw" and torch.equal(out["n"], torch.arange(3))
    assert torch.equal(out["rb"]["a"], torch.tensor([1, 2]))
    assert list(out["rb"]["s"]) == ["x", "y"]
    assert isinstance(out["l"][0], torch.Tensor)


def test_workers_pay_only_with_two_workers_and_a_core_each_beside_the_main() -> None:
    # in one process the loader reads on about one core; the worker path costs
    # 1.5-2.1 times as much CPU per sample (WORKER_CPU), so fewer cores lose
    assert not workers_pay(1, 64)                   # one worker: the same work, dearer
    assert not workers_pay(2, 2) and not workers_pay(4, 2)      # this CI machine
    assert workers_pay(2, 3) and workers_pay(8, 3) and workers_pay(4, 16)
    assert 1 <= usable_cores() <= (os.cpu_count() or 1)


@pytest.fixture
def one_core() -> Iterator[None]:
    """This process (and what it forks) on one core, as under a cpuset of one."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_too_few_cores_read_in_this_process_and_say_so(
        make: Any, one_core: None, caplog: pytest.LogCaptureFixture) -> None:
    data = make()
    expected = [keys_of(b) for b in data.loader.for_worker(0, 1)]
    with caplog.at_level(logging.WARNING, logger="stager.torch"):
        dl = StagerDataLoader(data, num_workers=2, multiprocessing_context="fork",
                              prefetch_factor=4)
    assert dl.in_process and dl.workers_asked == 2 and dl.num_workers == 0
    assert "read in this process" in caplog.text and "fallback=False" in caplog.text
    got = [keys_of(b) for b in dl]
    assert got == expected                          # the same batches, in order
    assert data.loader.stats()["samples"] == N      # read here, by the loader itself
    assert dl.state_dict()["cursor"] == data.loader.state_dict()["cursor"]
    forced = StagerDataLoader(make(), num_workers=2, multiprocessing_context="fork",
                              fallback=False)
    assert not forced.in_process and forced.num_workers == 2


def test_a_worker_packs_a_plain_batch_in_one_pass_and_converts_the_others() -> None:
    from stager.loader.torchshare import InWorker, convert
    step = InWorker(convert, True)
    plain = [{"__key__": "a", "__index__": 0, "data": b"xy"}, {"__key__": "b", "data": b"z"}]
    packed = step(plain)
    mapped: dict[tuple[int, int], Any] = {}         # the main process's, across batches
    assert type(packed) is SharedBatch and packed.lengths == [2, 1]
    assert [{k: bytes(v) if k == "data" else v for k, v in s.items()}
            for s in packed.unpack(mapped)] == plain
    assert plain[0]["data"] == b"xy"                # the caller's dicts are left alone
    mixed = [{"data": b"xy", "n": np.arange(3)}]     # numpy: converted, then packed
    got = step(mixed).unpack(mapped)
    assert torch.equal(got[0]["n"], torch.arange(3)) and bytes(got[0]["data"]) == b"xy"
