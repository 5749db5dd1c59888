"""How a DataLoader worker's batches cross to the main process (for :mod:`stager.torch`).

A batch of sample dicts travels as a :class:`SharedBatch`: its ``bytes`` values
copied once into one of the worker's shared-memory buffers (:class:`Slots`),
the rest pickled; the main process hands out read-only ``memoryview`` s of the
buffer.  Here, not in :mod:`stager.torch`, so that module stays the adapter's
surface; this one imports torch, and only :mod:`stager.torch` imports it.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils.data import default_convert, get_worker_info


class Step:
    """A worker's batch with its step number in the rank's pass (for the main
    process to hand the workers' runs out in step order)."""

    __slots__ = ("step", "batch")

    def __init__(self, step: int, batch: Any) -> None:
        self.step, self.batch = step, batch

    def __reduce__(self) -> tuple[Any, ...]:
        return Step, (self.step, self.batch)


class SharedBatch:
    """A batch of sample dicts on its way from a DataLoader worker to the main process.

    The dicts' ``bytes`` values are copied into a ``uint8`` tensor in shared
    memory, one of a few buffers each worker reuses (:class:`Slots`); the dicts,
    with ``None`` in those places, are pickled as usual.  A buffer crosses as a
    tensor (torch passes a file descriptor) only the first time; after that the
    batch names it by (worker, slot) and the main process, which keeps it
    mapped, reads the same pages again: no descriptor passing, no page faults.
    :meth:`unpack` puts the samples back, in the same keys and order, as
    read-only memoryviews of the buffer, which goes back to the worker once the
    last of them is gone (or, with ``copy``, as bytes, the buffer back at once).
    """

    __slots__ = ("samples", "spots", "keys", "lengths", "worker", "slot", "data", "busy")

    def __init__(self, samples: list[dict[str, Any]], spots: list[int], keys: list[str],
                 lengths: list[int], worker: int, slot: int, data: torch.Tensor | None,
                 busy: torch.Tensor | None) -> None:
        self.samples = samples
        self.spots, self.keys, self.lengths = spots, keys, lengths    # sample, key, size
        self.worker, self.slot = worker, slot       # slot -1: a buffer of its own
        self.data, self.busy = data, busy           # sent when new to the main process

    @classmethod
    def pack(cls, batch: Any, slots: Slots | None = None, plain: bool = False) -> Any:
        """``batch`` packed when it is a list of dicts holding bytes, else unchanged.
        With ``plain``, None when a value is not bytes, str, a number or None (the
        caller converts the batch first): the check :func:`convert` makes, in the
        same pass over the samples."""
        if type(batch) is not list:
            return None if plain else batch
        samples, spots, keys, values = [], [], [], []
        for i, s in enumerate(batch):
            if type(s) is not dict:
                return None if plain else batch
            s = dict(s)
            for k, v in s.items():
                t = type(v)
                if t is bytes:
                    spots.append(i)
                    keys.append(k)
                    values.append(v)
                    s[k] = None
                elif plain and t not in _PLAIN:
                    return None
            samples.append(s)
        lengths = [len(v) for v in values]
        total = sum(lengths)
        if not total:
            return batch
        slot, data, new = slots.take(total) if slots is not None else (-1, _shared(total), True)
        view = memoryview(data.numpy())
        pos = 0
        for v, n in zip(values, lengths, strict=True):
            view[pos:pos + n] = v
            pos += n
        busy = None
        if slots is not None and not slots.announced:
            busy, slots.announced = slots.busy, True
        return cls(samples, spots, keys, lengths, -1 if slots is None else slots.worker, slot,
                   data if new else None, busy)

    def unpack(self, mapped: dict[tuple[int, int], torch.Tensor] | None = None,
               copy: bool = False) -> list[dict[str, Any]]:
        """The batch as it was packed, its bytes as views of the shared buffer (or,
        with ``copy``, as ``bytes``).  ``mapped`` keeps the buffers that came with
        earlier batches of this pass (the caller's, from one batch to the next)."""
        mapped = {} if mapped is None else mapped
        if self.busy is not None:
            mapped[self.worker, -1] = self.busy
        data = self.data
        if data is None:
            data = mapped[self.worker, self.slot]
        elif self.slot >= 0:
            mapped[self.worker, self.slot] = data
        # A new array object for this batch: its views keep it alive, and it hands
        # the buffer back when the last of them goes.
        array = data.numpy()
        view = memoryview(array).toreadonly()
        pos = 0
        if copy:
            for i, k, n in zip(self.spots, self.keys, self.lengths, strict=True):
                self.samples[i][k] = bytes(view[pos:pos + n])
                pos += n
            if self.slot >= 0:
                _release(mapped[self.worker, -1], self.slot)
            return self.samples
        for i, k, n in zip(self.spots, self.keys, self.lengths, strict=True):
            self.samples[i][k] = view[pos:pos + n]
            pos += n
        if self.slot >= 0:
            weakref.finalize(array, _release, mapped[self.worker, -1], self.slot)
        return self.samples


def _release(busy: torch.Tensor, slot: int) -> None:
    """Hand buffer ``slot`` back to its worker (see :class:`Slots`)."""
    busy.numpy()[slot] = 0


def _shared(n: int) -> torch.Tensor:
    """``n`` bytes in shared memory, through torch's public ``share_memory_`` (it moves
    the fresh buffer there: a copy of ``n`` bytes, paid once per buffer, which
    :class:`Slots` reuses)."""
    return torch.empty(n, dtype=torch.uint8).share_memory_()


class Slots:
    """A worker's shared-memory batch buffers: reused, so neither process faults in
    fresh pages for every batch.  ``busy[j]`` is set by the worker when it sends
    buffer ``j`` and cleared by the main process once the batch's samples are gone;
    with every buffer busy (the main process holds ``prefetch_factor`` batches per
    worker and up to a run of a worker's batches while it hands out another's, and
    the user may keep more) a batch gets a buffer of its own.  Buffers are made
    on first use: a worker whose batches are dropped at once uses a few."""

    COUNT = 16

    def __init__(self, worker: int) -> None:
        self.worker = worker
        self.busy = _shared(self.COUNT)
        self.announced = False                      # busy went to the main process
        self._busy = self.busy.numpy()
        self._busy[:] = 0
        self.buffers: list[torch.Tensor | None] = [None] * self.COUNT

    def take(self, size: int) -> tuple[int, torch.Tensor, bool]:
        """(slot, buffer, whether the main process has not seen it yet)."""
        free = [j for j in range(self.COUNT) if not self._busy[j]]
        if not free:
            return -1, _shared(size), True
        # a free buffer big enough, else the first free one, made big enough
        j = next((j for j in free if (b := self.buffers[j]) is not None and len(b) >= size),
                 free[0])
        buffer, new = self.buffers[j], False
        if buffer is None or len(buffer) < size:
            buffer, new = _shared(size + size // 8), True
            self.buffers[j] = buffer
        self._busy[j] = 1
        return j, buffer, new


class InWorker:
    """A worker's collate step, then (with ``share``) :meth:`SharedBatch.pack` into
    its buffers; a :class:`Step` keeps its tag (picklable for spawn; the buffers
    are made in the worker, on first use)."""

    def __init__(self, collate: Any, share: bool) -> None:
        self.collate, self.share = collate, share
        self.slots: Slots | None = None

    def __call__(self, item: Any) -> Any:
        if type(item) is Step:
            return Step(item.step, self(item.batch))
        if not self.share:
            return self.collate(item)
        if self.slots is None:
            info = get_worker_info()
            self.slots = Slots(0 if info is None else info.id)
        if self.collate is convert:
            # one pass over the samples where convert's check and pack's took two
            packed = SharedBatch.pack(item, self.slots, plain=True)
            if packed is not None:
                return packed
        return SharedBatch.pack(self.collate(item), self.slots)

    def __getstate__(self) -> dict[str, Any]:
        return {"collate": self.collate, "share": self.share, "slots": None}


_PLAIN = (bytes, str, int, float, bool, type(None))


def convert(batch: Any) -> Any:
    """DataLoader's ``default_convert`` (numpy arrays to tensors, recursively), minus
    its walk through every field of every sample when there is nothing to convert:
    a list of sample dicts of bytes, strings and numbers (a ``tar`` or ``files``
    batch) is handed on as it is.  The walk cost 9 µs per such sample here, half
    as much as the Loader's own work for it."""
    if type(batch) is list and all(type(s) is dict and all(type(v) in _PLAIN
                                                            for v in s.values())
                                   for s in batch):
        return batch
    return default_convert(batch)
