"""PyTorch adapter (optional extra ``torch``): datasets, a resumable DataLoader, a GPU feeder.

::

    ds = StagerDataset("/datasets/shards", batch_size=256, map=decode, collate=stack)
    dl = StagerDataLoader(ds, num_workers=4)        # rank/world from torch.distributed
    for epoch in range(10):
        ds.set_epoch(epoch)
        for batch in DeviceFeeder(dl):              # pinned, copied on a side stream
            step(batch)
        save({"data": dl.state_dict(), ...})

The dataset yields whole batches (the loader batches, prefetches and shards).
Under :class:`StagerDataLoader`, the workers of a rank share its epoch plan
(computed once, before they fork) and split its fetch groups: worker ``w`` of
``k`` reads runs of consecutive steps in turn (:mod:`stager.loader.workers`;
about one shuffle window a run, so each worker reads whole windows' chunks),
tags each batch with its step, and the main process hands them out in step
order, so no sample is read twice and the exact resume state is the count of
batches handed out.  Under a plain DataLoader, worker ``w`` reads steps ``w,
w + k, …``, which the DataLoader's round-robin puts back in order.  Workers may
be forked: the loader's client, pool and pipeline are re-created in each process.
On too few cores for workers to read faster than this process
(:func:`~stager.loader.workers.workers_pay`), :class:`StagerDataLoader` reads in
this process instead and says so (``fallback=False`` forks them anyway).

From a worker, a batch of sample dicts travels as a :class:`SharedBatch`: its
``bytes`` values copied once into one of the worker's shared-memory buffers,
and the rest pickled.  The main process hands out read-only ``memoryview`` s of
that buffer (no copy), and the buffer goes back to the worker when the last of
them is dropped; ``share_bytes="copy"`` hands out ``bytes`` copied out instead.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .loader import Loader
from .loader.torchshare import InWorker, SharedBatch, Step, convert
from .loader.workers import run_length, usable_cores, workers_pay

log = logging.getLogger(__name__)

__all__ = ["DeviceFeeder", "SharedBatch", "StagerDataLoader", "StagerDataset", "convert",
           "dist_rank_world", "to_tensors"]


def dist_rank_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world size): the ones given, else torch.distributed's when initialised."""
    if rank is not None and world_size is not None:
        return rank, world_size
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return (torch.distributed.get_rank() if rank is None else rank,
                torch.distributed.get_world_size() if world_size is None else world_size)
    return rank or 0, world_size or 1


class StagerDataset(IterableDataset):  # type: ignore[type-arg]
    """An ``IterableDataset`` of batches of one rank; ``Loader`` keyword arguments apply."""

    def __init__(self, source: str, *, batch_size: int, rank: int | None = None,
                 world_size: int | None = None, **loader_kwargs: Any) -> None:
        rank, world_size = dist_rank_world(rank, world_size)
        self.loader = Loader(source, batch_size=batch_size, rank=rank, world_size=world_size,
                             **loader_kwargs)
        # Set by StagerDataLoader: workers read runs of ``run`` steps and yield each
        # batch as a Step (a plain DataLoader wants bare batches, round-robin).
        self.run = 1
        self.tagged = False

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if info is None:
            # In this process: the loader itself, so its position, telemetry and
            # read-ahead into the next epoch carry over from pass to pass.
            yield from self.loader
            return
        # In a worker: a copy that reads this worker's steps only.
        clone = self.loader.for_worker(info.id, info.num_workers, self.run)
        try:
            if self.tagged:
                for step, batch in zip(clone.worker_steps(), clone, strict=True):
                    yield Step(step, batch)
            else:
                yield from clone
        finally:
            clone.close()

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def stats(self) -> dict[str, Any]:
        """Telemetry of what was read in this process (``num_workers=0``)."""
        return self.loader.stats()

    def close(self) -> None:
        self.loader.close()

    def __enter__(self) -> StagerDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



class StagerDataLoader(DataLoader):  # type: ignore[type-arg]
    """A DataLoader over a :class:`StagerDataset` that keeps an exact resume state.

    Batches are handed out in step order (see the module doc), so the position is
    the number of batches handed out.  ``persistent_workers`` is refused: workers
    must be forked afresh for each pass to start at the right position.  With
    workers, batches of sample dicts cross over in shared memory
    (:class:`SharedBatch`): their bytes as read-only memoryviews of it, or with
    ``share_bytes="copy"`` as bytes copied out; ``share_bytes=False`` pickles them
    through the pipe.  Without a ``collate_fn``, batches go through :func:`convert`.

    ``fallback`` (default on): where the workers cannot read faster than this
    process alone (:func:`~stager.loader.workers.workers_pay`: fewer than two
    workers, or fewer cores than workers + 1), the batches are read in this process
    instead, as with ``num_workers=0``, and a warning says so once;
    :attr:`in_process` tells, :attr:`workers_asked` keeps the number asked for.
    ``fallback=False`` starts the workers anyway.
    """

    def __init__(self, dataset: StagerDataset, *, share_bytes: bool | str = True,
                 fallback: bool = True, **kwargs: Any) -> None:
        if kwargs.pop("batch_size", None) is not None:
            raise ValueError("the dataset batches; leave batch_size unset")
        if kwargs.get("persistent_workers"):
            raise ValueError("persistent_workers would keep stale positions; leave it off")
        if share_bytes not in (True, False, "copy"):
            raise ValueError(f"share_bytes is True, False or 'copy', not {share_bytes!r}")
        self.copy_bytes = share_bytes == "copy"
        self.workers_asked = kwargs.get("num_workers", 0)
        self.in_process = bool(fallback and self.workers_asked > 0 and
                               not workers_pay(self.workers_asked, usable_cores()))
        if self.in_process:
            _fall_back(kwargs)
        collate = kwargs.get("collate_fn") or convert
        if kwargs.get("num_workers", 0) > 0:
            collate = InWorker(collate, bool(share_bytes))
        loader = dataset.loader
        self.run = run_length(loader.window, loader.batch_size, loader.world_size,
                              loader.prefetch.batches)     # steps per worker run
        kwargs["collate_fn"] = collate
        super().__init__(dataset, batch_size=None, **kwargs)

    @property
    def loader(self) -> Loader:
        """The dataset's loader (in this process)."""
        assert isinstance(self.dataset, StagerDataset)
        return self.dataset.loader

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        if self.num_workers == 0:
            yield from super().__iter__()   # the loader itself counts what it hands out
            return
        loader = self.loader
        loader.begin_pass()             # before the workers fork: they start here
        loader.global_order()           # the epoch's order, planned once for them all
        dataset = self.dataset
        assert isinstance(dataset, StagerDataset)
        # Only for the workers started now (forked, or pickled for spawn, here): a
        # plain DataLoader over the same dataset later gets it round-robin, untagged.
        dataset.tagged, dataset.run = True, self.run
        try:
            batches = super().__iter__()
        finally:
            dataset.tagged, dataset.run = False, 1
        mapped: dict[tuple[int, int], torch.Tensor] = {}   # the workers' shared buffers
        # The DataLoader takes the workers' batches round-robin; a worker reads runs
        # of steps, so the next step may come a run later: hold it until its turn.
        waiting: dict[int, Any] = {}
        step = 0
        for item in batches:
            waiting[item.step] = item.batch
            del item
            while step in waiting:
                # in a box: while the consumer holds the batch this generator does
                # not, so its buffer goes back as soon as the consumer drops it
                box = [waiting.pop(step)]
                if type(box[0]) is SharedBatch:
                    box[0] = box[0].unpack(mapped, self.copy_bytes)
                step += 1
                loader.advance()
                yield box.pop()
        if waiting:
            raise RuntimeError(f"the workers skipped step {step} of the pass")

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)


def _fall_back(kwargs: dict[str, Any]) -> None:
    """DataLoader options for reading in this process instead of ``num_workers``
    workers (those it refuses without workers dropped), and the warning: one per
    DataLoader made, as each one falls back."""
    log.warning("StagerDataLoader(num_workers=%d) on %d usable cores: the batches are "
                "read in this process, where workers would read slower "
                "(fallback=False starts them anyway)", kwargs["num_workers"],
                usable_cores())
    kwargs["num_workers"] = 0
    for worker_only in ("prefetch_factor", "multiprocessing_context", "worker_init_fn"):
        kwargs.pop(worker_only, None)


def to_tensors(batch: Any) -> Any:
    """Numbers to tensors, recursively: numpy arrays, Arrow record batches (numeric
    columns), lists and dicts; bytes and strings are left as they are."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, np.ndarray):
        if batch.dtype.kind not in "biufc":
            return batch
        return torch.from_numpy(batch if batch.flags.writeable else batch.copy())
    if isinstance(batch, dict):
        return {k: to_tensors(v) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(to_tensors(v) for v in batch)
    if type(batch).__name__ == "RecordBatch":
        return {name: to_tensors(col.to_numpy(zero_copy_only=False))
                for name, col in zip(batch.schema.names, batch.columns, strict=True)}
    return batch


class DeviceFeeder:
    """Batches moved to ``device`` one step ahead of the consumer.

    On CUDA each batch's tensors are pinned and copied with ``non_blocking=True``
    on a side stream while the consumer still works on the previous batch; the
    consumer's stream waits on an event recorded after that batch's copies (not
    on the whole side stream, so the next copy keeps overlapping), and each
    tensor is ``record_stream``-ed so its memory is not reused too early.
    Without CUDA (or for ``device="cpu"``) batches are only turned into tensors.
    """

    def __init__(self, batches: Iterable[Any], device: str | torch.device | None = None, *,
                 pin_memory: bool = True) -> None:
        self.batches = batches
        self.device = torch.device(device if device is not None else
                                   ("cuda" if torch.cuda.is_available() else "cpu"))
        self.pin_memory = pin_memory and self.device.type == "cuda"
        self.stream: torch.cuda.Stream | None = None
        self.pinned = 0            # tensors copied from pinned host memory
        self.copies = 0            # batches copied on the side stream
        self.last_host: Any = None # the host side of the last batch staged (for checks)

    def __iter__(self) -> Iterator[Any]:
        if self.device.type != "cuda":
            for batch in self.batches:
                yield _move(to_tensors(batch), self.device, non_blocking=False)
            return
        pending = None
        for batch in self.batches:
            staged = self._stage(batch)
            if pending is not None:
                yield self._finish(*pending)
            pending = staged
        if pending is not None:
            yield self._finish(*pending)

    def _stage(self, batch: Any) -> tuple[Any, torch.cuda.Event]:
        """Start moving ``batch``: returns the device batch and the event its copies end at."""
        host = to_tensors(batch)
        if self.pin_memory:
            host = self._pin(host)
        self.last_host = host
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self.stream):
            moved = _move(host, self.device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        self.copies += 1
        return moved, done

    def _finish(self, moved: Any, done: torch.cuda.Event) -> Any:
        current = torch.cuda.current_stream(self.device)
        current.wait_event(done)
        _each_tensor(moved, lambda t: t.record_stream(current))
        return moved

    def _pin(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            self.pinned += 1
            return obj if obj.is_pinned() else obj.pin_memory()
        if isinstance(obj, dict):
            return {k: self._pin(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return type(obj)(self._pin(v) for v in obj)
        return obj


def _move(obj: Any, device: torch.device, *, non_blocking: bool) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, dict):
        return {k: _move(v, device, non_blocking=non_blocking) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_move(v, device, non_blocking=non_blocking) for v in obj)
    return obj


def _each_tensor(obj: Any, fn: Any) -> None:
    if isinstance(obj, torch.Tensor):
        fn(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _each_tensor(v, fn)
    elif isinstance(obj, list | tuple):
        for v in obj:
            _each_tensor(v, fn)
