"""A registered Loader plan's future reads, by cached chunk: what the metadata server asks.

A Loader that reads a cached dataset registers its plan as parameters, not as a
list (:class:`Plan`, from the plain dict of a request body), together with the
dataset as the Loader reads it (:class:`Dataset`: its files and each sample's
byte extents in them).  From the two, :func:`plan_uses` derives every rank's
reads with the Loader's own order and partition functions and answers, for a
cached chunk ``(file_id, chunk_index)``, the first global step of the plan that
reads it: the future that plan-aware eviction looks at
(:func:`stager.eviction.plan`).

Time is the plan's global step (one batch on every rank, counted on across the
plan's epochs from its first ``epoch`` and ``cursor``), which a job's telemetry
gives back as ``(epoch, cursor)`` (:meth:`Plan.step_at`).  Several jobs' plans
are compared by steps from now (:func:`soonest`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BadRequest
from ..eviction import Uses
from .accesses import Accesses, SampleChunks, epoch_steps, plan_accesses
from .order import ORDERS, check_blocks, regular_blocks
from .partition import PARTITIONS

ChunkKey = tuple[str, int]          # (file id, chunk index), as the cache keys a chunk
CHUNK_BITS = 32                     # a chunk's integer key: file << CHUNK_BITS | chunk
MAX_EPOCHS = 64                     # epochs one registration may cover


def _int(obj: Mapping[str, Any], key: str, default: int | None = None, *,
         least: int | None = 0) -> int:
    value = obj.get(key, default)
    if value is None:
        raise BadRequest(f"plan field {key!r} is required", field=key)
    if isinstance(value, bool) or not isinstance(value, int) or (
            least is not None and value < least):
        raise BadRequest(f"plan field {key!r} must be an integer"
                         + ("" if least is None else f" of at least {least}"), field=key)
    return value


def _name(obj: Mapping[str, Any], key: str, default: str, registry: Any) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str) or value not in registry:
        raise BadRequest(f"plan field {key!r} must name one of {', '.join(sorted(registry))}",
                         field=key)
    return value


@dataclass(frozen=True, eq=False)
class Plan:
    """A Loader's epoch plan as parameters: the epochs ``epoch … epoch + epochs - 1``
    from position ``cursor`` of the first, read by ``world_size`` ranks in batches
    of ``batch_size``; ``order``, ``window`` and ``blocks`` (block starts) draw
    each epoch's order, ``partition`` and ``drop_last`` share it out, as the
    Loader of the same parameters does."""

    seed: int
    epoch: int
    world_size: int
    batch_size: int
    window: int
    blocks: np.ndarray
    epochs: int = 2
    cursor: int = 0
    order: str = "window_of_blocks"
    partition: str = "interleaved"
    drop_last: bool = True

    @classmethod
    def from_dict(cls, obj: Any, samples: int) -> Plan:
        """The plan of a request body for a dataset of ``samples`` samples:
        ``{"seed", "epoch", "world_size", "batch_size", "window", "blocks" (block
        starts) or "block" (samples a block), "epochs", "cursor", "order",
        "partition", "drop_last"}``; BadRequest names the first bad field."""
        if not isinstance(obj, Mapping):
            raise BadRequest("a plan must be an object")
        if "blocks" in obj:
            blocks = obj["blocks"]
            if not isinstance(blocks, list) or not all(
                    isinstance(b, int) and not isinstance(b, bool) for b in blocks):
                raise BadRequest("plan field 'blocks' must be a list of block starts",
                                 field="blocks")
            try:
                starts = check_blocks(samples, np.array(blocks, dtype=np.int64))
            except (ValueError, OverflowError) as e:
                raise BadRequest(f"plan field 'blocks': {e}", field="blocks") from None
        else:
            starts = regular_blocks(samples, _int(obj, "block", 1, least=1))
        drop_last = obj.get("drop_last", True)
        if not isinstance(drop_last, bool):
            raise BadRequest("plan field 'drop_last' must be true or false",
                             field="drop_last")
        epochs = _int(obj, "epochs", 2, least=1)
        if epochs > MAX_EPOCHS:
            raise BadRequest(f"plan field 'epochs' must be at most {MAX_EPOCHS}",
                             field="epochs")
        cursor = _int(obj, "cursor", 0)
        if cursor > samples:
            raise BadRequest(f"plan field 'cursor' must be at most the {samples} samples",
                             field="cursor")
        return cls(seed=_int(obj, "seed", least=None), epoch=_int(obj, "epoch"),
                   world_size=_int(obj, "world_size", least=1),
                   batch_size=_int(obj, "batch_size", least=1),
                   window=_int(obj, "window", least=1), blocks=starts, epochs=epochs,
                   cursor=cursor, order=_name(obj, "order", "window_of_blocks", ORDERS),
                   partition=_name(obj, "partition", "interleaved", PARTITIONS),
                   drop_last=drop_last)

    def steps(self, samples: int, first: bool) -> int:
        """Global steps of one of the plan's epochs (the first starts at ``cursor``)."""
        return epoch_steps(samples, self.cursor if first else 0, self.world_size,
                           self.batch_size, partition=self.partition,
                           drop_last=self.drop_last)

    def step_at(self, samples: int, epoch: int, cursor: int) -> int:
        """The global step of the plan a job at ``(epoch, cursor)`` is at (its
        telemetry's position; the plan's end when past it, 0 before it)."""
        if epoch < self.epoch or (epoch == self.epoch and cursor <= self.cursor):
            return 0
        done = 0
        for i in range(min(epoch - self.epoch, self.epochs)):
            done += self.steps(samples, i == 0)
        if epoch - self.epoch >= self.epochs:
            return done
        start = self.cursor if epoch == self.epoch else 0
        return done + (min(cursor, samples) - start) // (self.world_size * self.batch_size)


@dataclass(frozen=True, eq=False)
class Dataset:
    """A dataset as a Loader reads it: ``files`` (file ids) with their
    ``chunk_sizes``, and ``samples`` samples whose bytes are the extents
    ``length[i]`` bytes of file ``file[i]`` (an index into ``files``) from
    ``offset[i]``, for sample ``sample[i]`` (a sample may have several extents)."""

    files: tuple[str, ...]
    chunk_sizes: tuple[int, ...]
    samples: int
    sample: np.ndarray
    file: np.ndarray
    offset: np.ndarray
    length: np.ndarray

    def __post_init__(self) -> None:
        for name in ("sample", "file", "offset", "length"):
            object.__setattr__(self, name, np.asarray(getattr(self, name), dtype=np.int64))
        if len(self.files) != len(self.chunk_sizes) or any(c < 1 for c in self.chunk_sizes):
            raise BadRequest("every file needs a positive chunk size")
        shapes = {np.shape(a) for a in (self.sample, self.file, self.offset, self.length)}
        if len(shapes) != 1 or len(shapes.pop()) != 1:
            raise BadRequest("extents need one sample, file, offset and length each")
        if len(self.sample) and (
                self.sample.min() < 0 or self.sample.max() >= self.samples
                or self.file.min() < 0 or self.file.max() >= len(self.files)
                or self.offset.min() < 0 or self.length.min() < 0):
            raise BadRequest("extents must name samples and files of the dataset, "
                             "at offsets and lengths of at least 0")

    def chunks(self) -> SampleChunks:
        """The chunk keys each sample reads (``file << CHUNK_BITS | chunk``)."""
        sizes = np.asarray(self.chunk_sizes, dtype=np.int64)[self.file]
        read = self.length > 0
        first = self.offset // sizes
        count = np.where(read, (self.offset + self.length - 1) // sizes - first + 1, 0)
        if len(count) and int((first + count).max()) > 1 << CHUNK_BITS:
            raise BadRequest(f"a file of more than 2**{CHUNK_BITS} chunks")
        total = int(count.sum())
        extent = np.repeat(np.arange(len(count), dtype=np.int64), count)
        within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
        keys = (self.file[extent] << CHUNK_BITS) | (first[extent] + within)
        owner = self.sample[extent]
        by_sample = np.argsort(owner, kind="stable")    # a sample's extents in their order
        starts = np.searchsorted(owner[by_sample], np.arange(self.samples + 1))
        return SampleChunks(starts, keys[by_sample])

    def name(self, key: int) -> ChunkKey:
        """The cache's key of the chunk of integer key ``key``."""
        return self.files[key >> CHUNK_BITS], key & ((1 << CHUNK_BITS) - 1)


def registered_accesses(plan: Plan, dataset: Dataset) -> Accesses:
    """Every rank's chunk reads over the plan's epochs (integer keys: :meth:`Dataset.name`)."""
    return plan_accesses(dataset.chunks(), block_starts=plan.blocks,
                         batch_size=plan.batch_size, world_size=plan.world_size,
                         epochs=range(plan.epoch, plan.epoch + plan.epochs),
                         window=plan.window, seed=plan.seed, order=plan.order,
                         partition=plan.partition, drop_last=plan.drop_last,
                         cursor=plan.cursor)


class PlanUses:
    """When a registered plan reads each cached chunk, in steps: ``uses((file_id,
    chunk), step)`` is the first global step at or after ``step`` whose batches
    read the chunk (``math.inf``: never again in the plan).

    Ranks run side by side, so a step's batches are one moment to the server;
    :meth:`after` tells them apart (rank ``r`` of ``W`` reads at ``step + r / W``)
    for a replay of the reads one at a time.
    """

    def __init__(self, accesses: Accesses, dataset: Dataset, world_size: int) -> None:
        self.accesses = accesses
        self._world = world_size
        self._uses = Uses(accesses.key, accesses.step * world_size + accesses.rank)
        self._key = {dataset.name(k): k for k in np.unique(accesses.key).tolist()}

    def __call__(self, key: ChunkKey, step: int) -> float:
        number = self._key.get(key)
        if number is None:
            return math.inf
        t = self._uses(number, step * self._world - 1)
        return t if t == math.inf else t // self._world

    def after(self, key: ChunkKey, step: int, rank: int) -> float:
        """The first read of ``key`` after rank ``rank``'s batch of ``step``, at
        ``step + rank / world_size`` (``math.inf``: none)."""
        number = self._key.get(key)
        if number is None:
            return math.inf
        return self._uses(number, step * self._world + rank) / self._world


def plan_uses(plan: Mapping[str, Any] | Plan, dataset: Dataset) -> PlanUses:
    """The next-use table of a registered plan (a plain dict as a request body has
    it, or a :class:`Plan`) over ``dataset``."""
    if not isinstance(plan, Plan):
        plan = Plan.from_dict(plan, dataset.samples)
    return PlanUses(registered_accesses(plan, dataset), dataset, plan.world_size)


def soonest(plans: Sequence[tuple[PlanUses, int]], key: ChunkKey) -> float:
    """Steps from now until any of ``plans`` (each with the step its job is at)
    reads ``key`` (``math.inf``: none will): furthest-next-use across jobs."""
    return min((uses(key, now) - now for uses, now in plans), default=math.inf)


def plan_id(*parts: Any) -> str:
    """The id a job's plan is registered under, from what identifies it (a Loader: its
    dataset path and fingerprint, seed, world size, batch size): 32 hex digits."""
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:32]
