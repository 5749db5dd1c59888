"""``Loader``: a deterministic, sharded, prefetching iterable of batches.

::

    loader = Loader("/datasets/shards", batch_size=256, rank=r, world_size=W, seed=0)
    loader.load_state_dict(saved)           # optional: exact resume, any W
    for epoch in range(loader.epoch, 10):
        loader.set_epoch(epoch)
        for batch in loader:
            train(batch)
            if time_to_checkpoint():
                save(loader.state_dict())    # {seed, epoch, cursor, …}: a few numbers

The global order of an epoch is ``order(seed, epoch, dataset)``; rank ``r``
takes its positions by the partition policy; the pipeline fetches exactly
those samples ahead of the consumer.  See :mod:`.order`, :mod:`.partition`
and :mod:`.pipeline`.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from fsspec.asyn import sync

from ..client import Client
from ..client.cluster import Cluster
from ..client.holder import current
from ..config import Config
from ..plans.order import TWO_LEVEL, epoch_order, regular_blocks
from ..plans.partition import PARTITIONS, Span, cursor_after
from . import formats
from .dataset import parse_source, resolve
from .fetch import Fetcher
from .memory import keep_freed_memory
from .options import group_options
from .pipeline import Pipeline
from .planreg import PlanRegistrar
from .report import Reporter
from .stats import Counters, copy_counters
from .workers import worker_steps

STATE_VERSION = 1


@dataclass
class _Stream:
    """A running pipeline and where the next pass would start in it."""

    pipeline: Pipeline
    next: int            # its batch number of that pass's first batch
    epoch: int           # the epoch that pass would be
    seed: int
_DEFAULT_CACHE = object()


class Loader:
    """Iterable of batches of a stager dataset for rank ``rank`` of ``world_size``.

    ``source``: a path or ``stager://`` URL of a directory, staged dataset,
    tar shard, Parquet file or zarr array.  ``format``: ``"auto"``, ``"files"``,
    ``"tar"``, ``"parquet"`` or ``"zarr"``.  The other keyword arguments are
    grouped by role (:mod:`.options`), into :attr:`sharding`, :attr:`ordering`,
    :attr:`prefetch`, :attr:`decoding` and :attr:`telemetry`:

    - which batches: ``rank``, ``world_size``, ``drop_last``, ``partition`` (a
      policy of ``PARTITIONS``, default ``interleaved``);
    - in what order: ``seed``, ``shuffle``; ``order`` names an order policy
      (default ``window_of_blocks`` when shuffling, ``sequential`` otherwise; a
      state saved under another policy with the default left alone resumes under
      that one); ``shuffle_block`` (samples per block) and ``shuffle_window``
      (positions per window) tune the two-level shuffle;
    - read ahead: ``prefetch_batches`` / ``prefetch_bytes`` bound what is read
      ahead; on glibc, malloc keeps up to twice ``prefetch_bytes`` of the memory
      the window frees for reuse (config ``loader_keep_freed``; see
      :mod:`stager.loader.memory`).  ``prefetch_next_epoch``: when a pass ends,
      keep prefetching the next epoch from its start (what the next ``iter()``
      reads unless ``set_epoch`` or ``load_state_dict`` moves elsewhere; then that
      prefetch is dropped).  ``prefetch_fill`` (default on): a new pipeline's first
      batch waits for a full window (:mod:`.pipeline`).  ``fetch``: :class:`~.fetch.FetchOptions`;
    - on the samples: ``map`` runs on each sample and ``collate`` on each batch's
      list of samples, both in a thread pool of ``decode_threads`` (default: the
      cores, at most 4).  ``output="numpy"`` gives Parquet batches as dicts of
      arrays;
    - telemetry: ``stats()`` always; with ``job="name"`` (or ``STAGER_JOB``, or
      ``report=True``, which names the job after the scheduler's job id) the
      loader also reports a summary of it to the metadata server every
      ``report_interval`` seconds (default 5) and once on ``close()``, from its
      I/O thread, so ``stager jobs`` shows which jobs starve.  Each rank, and each
      DataLoader worker of a rank, is one entry.  Reports that fail are counted
      in ``stats()["reports_failed"]`` and logged once; they never raise or block
      an iteration.  ``report=False`` turns reporting off whatever the environment.
    """

    def __init__(self, source: str, *, batch_size: int, meta_url: str | None = None,
                 client: Client | None = None, config: Config | None = None,
                 token: str | None = None, cluster: Cluster | None = None,
                 format: str = "auto", index_cache: Any = _DEFAULT_CACHE,
                 **options: Any) -> None:
        path, url_meta = parse_source(source)
        self.source = path
        self._owns_client = client is None
        self._origin = current()        # the holder of the process that made this loader
        self._client = client or Client(meta_url or url_meta, config=config, token=token,
                                        cluster=cluster)
        self._cluster = self._client.cluster    # a copy in a worker or unpickled makes one
        try:
            self.sharding, self.ordering, self.prefetch, self.decoding, self.telemetry = \
                group_options(self._cluster.config, os.environ, batch_size=batch_size,
                              **options)
            index_options: dict[str, Any] = {"output": self.decoding.output}
            if index_cache is not _DEFAULT_CACHE:
                index_options["index_cache"] = index_cache
            self.index = sync(self._client.loop, self._build_index, path, format,
                              index_options)
        except BaseException:
            if self._owns_client:
                self._client.close()
            raise
        self.format = self.index.format
        # the state of the order: load_state_dict may change both
        self.seed, self.order = self.ordering.seed, self.ordering.policy
        self.blocks = (regular_blocks(len(self.index), self.ordering.block)
                       if self.ordering.block else self.index.block_starts())
        mean_block = len(self.index) / max(1, len(self.blocks))
        self.window = self.ordering.window or max(1, int(round(8 * mean_block)))
        self.workers = (0, 1)           # (worker id, worker count) inside this rank
        self.worker_run = 1             # workers take runs of this many steps in turn
        self.lookahead = self.prefetch.next_epoch   # prefetch on into the next epoch
        self.in_worker = False          # a copy made by for_worker (reports its worker id)
        self._move_to(0, 0)
        self._order_cache: tuple[int, np.ndarray] | None = None
        self._reset_process_state()

    @property
    def batch_size(self) -> int:
        return self.sharding.batch_size

    @property
    def rank(self) -> int:
        return self.sharding.rank

    @property
    def world_size(self) -> int:
        return self.sharding.world_size

    async def _build_index(self, path: str, fmt: str, options: dict[str, Any]) -> formats.Index:
        client = self._client.aio
        src = await resolve(client, path)
        name = formats.detect(src) if fmt == "auto" else fmt
        return await formats.builder(name)(client, src, options)

    def _reset_process_state(self) -> None:
        """What must not cross a fork: the pool, the pipeline, counters."""
        self._process = current()       # the holder of the process they belong to
        self._pool: cf.ThreadPoolExecutor | None = None
        self._fetcher: Fetcher | None = None
        self._active: _Stream | None = None
        self.counters = Counters()
        self._targets: dict[str, Any] = {}        # the client's live per-target counters
        self._targets_base: dict[str, Any] = {}
        self._reporter: Reporter | None = None
        self._registrar: PlanRegistrar | None = None    # plan-aware eviction (planreg.py)

    def _check_process(self) -> None:
        if self._process is not current():
            self._reset_process_state()

    # -- plan -------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self._next_pass()[0]

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning, unless it is already the current one
        (so ``set_epoch`` after ``load_state_dict`` keeps the resumed position)."""
        if epoch != self.epoch:
            self._move_to(int(epoch), 0)

    def _move_to(self, epoch: int, cursor: int) -> None:
        self._epoch, self._cursor, self._steps, self._finished = epoch, cursor, 0, False
        self._pass_steps: int | None = None     # batches of the pass from here (lazily)

    def _rank_plan(self, cursor: int) -> list[Span]:
        s = self.sharding
        return PARTITIONS[s.partition](len(self.index), cursor, s.world_size, s.rank,
                                       s.batch_size, s.drop_last)

    def _plan(self, cursor: int) -> list[Span]:
        """This rank's (and worker's) batches from ``cursor``, as spans of the order."""
        worker, count = self.workers
        steps = self._rank_plan(cursor)
        if count == 1:
            return steps
        return [steps[i] for i in worker_steps(len(steps), worker, count, self.worker_run)]

    def worker_steps(self) -> list[int]:
        """The rank's step numbers (from the start of the next pass) of this copy's
        batches, in the order it yields them (see :mod:`.workers`)."""
        worker, count = self.workers
        return worker_steps(len(self._rank_plan(self._next_pass()[1])), worker, count,
                            self.worker_run)

    def _next_pass(self) -> tuple[int, int]:
        """(epoch, cursor) where the next batch comes from."""
        if self._finished:
            return self._epoch + 1, 0
        if not self._steps:
            return self._epoch, self._cursor
        total = len(self._rank_plan(self._cursor))
        if self._steps >= total:
            return self._epoch + 1, 0
        return self._epoch, cursor_after(len(self.index), self._cursor, self.world_size,
                                         self.batch_size, self._steps, total)

    def global_order(self, epoch: int | None = None) -> np.ndarray:
        """The epoch's sample order (the same on every rank and at every world size)."""
        epoch = self.epoch if epoch is None else epoch
        if self._order_cache is None or self._order_cache[0] != epoch:
            self._order_cache = (epoch, epoch_order(self.order, len(self.index), self.blocks,
                                                    self.seed, epoch, self.window))
        return self._order_cache[1]

    def __len__(self) -> int:
        """Batches the next ``iter()`` yields (the whole epoch on a fresh one)."""
        return len(self._plan(self._next_pass()[1]))

    # -- state ------------------------------------------------------------------------
    def io_position(self) -> tuple[int, int]:
        """Where this rank's reads are: the next batch's ``(epoch, cursor)`` moved on by
        the batches the prefetch has started beyond it (plan-aware eviction's now)."""
        epoch, cursor = self._next_pass()
        stream = self._active
        if stream is None:
            return epoch, cursor
        ahead = max(0, stream.pipeline.launching - (stream.next + self._steps))
        n = len(self.index)
        cursor += ahead * self.world_size * self.batch_size
        return (epoch, cursor) if cursor < n else (epoch + 1, min(n, cursor - n))

    def fingerprint(self) -> str:
        """Identifies the order: format, sample count, blocks, window, policy."""
        h = hashlib.sha256(f"{self.format}:{len(self.index)}:{self.window}:{self.order}:"
                           .encode())
        h.update(np.ascontiguousarray(self.blocks, dtype=np.int64).tobytes())
        return h.hexdigest()[:16]

    def state_dict(self) -> dict[str, Any]:
        """Where the job stands: the next batch is at ``cursor`` of epoch ``epoch``.

        The cursor counts positions consumed by all ranks together (every rank
        at the same step), so the state of any rank (rank 0 by convention)
        resumes a job of any world size.
        """
        epoch, cursor = self._next_pass()
        return {"version": STATE_VERSION, "seed": self.seed, "epoch": epoch,
                "cursor": cursor, "samples": len(self.index), "order": self.order,
                "fingerprint": self.fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where ``state`` was taken (any world size or batch size)."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported loader state version {state.get('version')!r}")
        saved = state.get("order")
        if saved != self.order and self.ordering.order is None and saved in TWO_LEVEL \
                and self.ordering.shuffle:
            # saved under the older default shuffle: resume exactly, under it
            self.order = saved
            self._order_cache = None
        if state.get("fingerprint") != self.fingerprint() or saved != self.order:
            raise ValueError("the loader state belongs to another dataset or order "
                             f"({state.get('samples')} samples, order {state.get('order')!r})")
        cursor = int(state["cursor"])
        if not 0 <= cursor <= len(self.index):
            raise ValueError(f"cursor {cursor} is outside the {len(self.index)} samples")
        self._stop_active()
        self.seed = int(state["seed"])
        self._order_cache = None
        self._move_to(int(state["epoch"]), cursor)

    # -- iteration --------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        self.begin_pass()
        if self._registrar is None:
            self._registrar = PlanRegistrar(self, self._client)
        self._registrar.begin(self._epoch, self._cursor)
        if self.telemetry.job is not None and self._reporter is None:
            # here, not in __init__: only a process that reads reports (not the main
            # process of a DataLoader whose workers read)
            self._reporter = Reporter(self, self._client, self.telemetry.job,
                                      self.telemetry.interval)
            self._reporter.start()
        plan = self._plan(self._cursor)
        order = self.global_order(self._epoch)
        batches = [order[s.start:s.stop] for s in plan]
        self.counters.iteration_started()
        if not batches:
            self._finished = True
            return iter(())
        # Started here, not at the first next(): the reads begin with iter().
        return self._consume(self._stream_for(batches), batches)

    def begin_pass(self) -> int:
        """Start the next pass where the last one stopped (``iter()`` does this);
        returns how many batches it has.  Adapters that iterate copies of this
        loader elsewhere (DataLoader workers) call it, then :meth:`advance`."""
        self._check_process()
        self._move_to(*self._next_pass())
        return self._steps_in_pass()

    def advance(self, batches: int = 1) -> None:
        """Record that the consumer took ``batches`` more batches of this pass."""
        self._steps += batches
        if self._steps >= self._steps_in_pass():
            self._finished = True

    def _steps_in_pass(self) -> int:
        # kept: planning a pass is O(its batches), and advance() runs once a batch
        if self._pass_steps is None:
            self._pass_steps = len(self._plan(self._cursor))
        return self._pass_steps

    def _consume(self, stream: _Stream, batches: list[np.ndarray]) -> Iterator[Any]:
        pipeline, base = stream.pipeline, stream.next
        completed = False
        try:
            for j, samples in enumerate(batches):
                start = time.perf_counter()
                self.counters.waiting_since = start
                try:
                    # in a box, not a local: the generator keeps no reference once
                    # it is yielded, so the batch is freed where the consumer drops
                    # it, not inside the next next() (a 4 MiB batch of small samples
                    # takes a while to free, which would count as stall)
                    box = [pipeline.get(base + j)]
                finally:
                    self.counters.waiting_since = None
                self.counters.batch_taken(time.perf_counter() - start, len(samples))
                # counted before the yield: a state saved while training on this
                # batch resumes after it
                self._steps += 1
                self._finished = j + 1 == len(batches)
                if self._registrar is not None:
                    self._registrar.at()
                yield box.pop()
            completed = True
        finally:
            if self._active is stream:      # not handed to a later pass meanwhile
                if completed and self.lookahead:
                    # it is already reading the next epoch: keep it for the next pass
                    self._active = _Stream(pipeline, base + len(batches), self._epoch + 1,
                                           self.seed)
                else:
                    self._stop_active()

    def _stream_for(self, batches: list[np.ndarray]) -> _Stream:
        """The pipeline that serves this pass: the one still running from the last
        pass when it is already reading exactly this (the next epoch from its start,
        or a pass that was begun but not read from), else a new one."""
        stream = self._active
        if stream is not None and (stream.epoch, stream.seed, self._cursor) == (
                self._epoch, self.seed, 0):
            self._active = _Stream(stream.pipeline, stream.next, stream.epoch, stream.seed)
            return self._active
        self._stop_active()
        pipeline = self._pipeline(batches)
        self._active = _Stream(pipeline, 0, self._epoch, self.seed)
        pipeline.start()
        return self._active

    def _next_epochs(self, epoch: int, seed: int) -> Callable[[int], list[np.ndarray] | None]:
        """Segment ``k`` of the pipeline: epoch ``epoch + k`` from its start (pure, so it
        can be computed off the I/O loop)."""
        plan = self._plan(0)
        n, order, blocks, window = len(self.index), self.order, self.blocks, self.window

        def segment(k: int) -> list[np.ndarray] | None:
            if not self.lookahead:
                return None
            epoch_k = epoch_order(order, n, blocks, seed, epoch + k, window)
            return [epoch_k[s.start:s.stop] for s in plan]
        return segment

    async def _prepare(self) -> Fetcher:
        # On the I/O loop: the client's session is made on first use, and needs it.
        client = self._client.aio
        self._targets = client.plane.counters
        self._targets_base = copy_counters(self._targets)
        return Fetcher(client, self.index.files, self.prefetch.fetch)

    def _pipeline(self, batches: list[np.ndarray]) -> Pipeline:
        if self._fetcher is None:           # once per loader and process
            self._fetcher = sync(self._client.loop, self._prepare)
            if self._cluster.config.loader_keep_freed:
                keep_freed_memory(2 * self.prefetch.bytes)
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(self.decoding.threads,
                                               thread_name_prefix="stager-decode")
        return Pipeline(self.index, self._fetcher, batches, loop=self._client.loop,
                        pool=self._pool, prefetch=self.prefetch, assemble=self._assemble,
                        counters=self.counters,
                        segments=self._next_epochs(self._epoch, self.seed),
                        blocks=self.blocks, fill=self.prefetch.fill,
                        assemble_inline=self.decoding.plain and self.index.batch_inline)

    def _assemble(self, samples: np.ndarray, units: np.ndarray, decoded: dict[int, Any]) -> Any:
        decoding = self.decoding
        if decoding.plain:
            return self.index.batch(samples, units, decoded)
        items = [self.index.sample(int(s), int(u), decoded[int(u)])
                 for s, u in zip(samples, units, strict=True)]
        if decoding.map is not None:
            items = [decoding.map(x) for x in items]
        return decoding.collate(items) if decoding.collate is not None else items

    # -- workers, telemetry, lifecycle ----------------------------------------------------
    def for_worker(self, worker: int, workers: int, run: int = 1) -> Loader:
        """A copy of this loader that reads only worker ``worker`` of ``workers``'s steps:
        every ``workers``-th step (``run`` 1), else runs of ``run`` steps in turn."""
        worker_steps(0, worker, workers, run)       # checks the numbers
        clone = object.__new__(Loader)
        clone.__dict__.update(self.__dict__)
        clone.workers = (worker, workers)
        clone.worker_run = run
        clone._pass_steps = None
        clone.in_worker = True
        clone.lookahead = False         # a worker lives for one pass
        clone._owns_client = False
        clone._reset_process_state()
        return clone

    def stats(self) -> dict[str, Any]:
        """Samples, batches, bytes, stall, fetch/decode time, time to first batch,
        per target bytes, requests and mean latency, where the job stands (epoch,
        cursor) and the telemetry reports sent and failed."""
        out = self.counters.snapshot(self._targets, self._targets_base)
        epoch, cursor = self._next_pass()
        out.update(rank=self.rank, world_size=self.world_size, epoch=epoch, cursor=cursor,
                   format=self.format, report_job=self.telemetry.job, reports_sent=0,
                   reports_failed=0, report_error=None)
        if self._reporter is not None:
            out.update(self._reporter.counts())
        return out

    def _stop_active(self) -> None:
        if self._active is not None:
            self._active.pipeline.stop()
            self._active = None

    def close(self) -> None:
        if self._process is current():
            self._stop_active()
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            if self._reporter is not None:
                self._reporter.close()      # the final report, with everything counted
            if self._registrar is not None:
                self._registrar.close()
            # A copy in a forked worker closes that process's own session.
            if self._owns_client or self._origin is not current():
                self._client.close()

    def __del__(self) -> None:
        # Forgotten without close(): stop prefetching (without waiting: this may run
        # on any thread, the I/O loop's included).
        stream = self.__dict__.get("_active")
        if stream is not None and self.__dict__.get("_process") is current():
            stream.pipeline.stop(wait=False)

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in ("_pool", "_fetcher", "_active", "counters", "_order_cache", "_client",
                    "_targets", "_targets_base", "_reporter", "_process", "_origin"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._client = Client(cluster=self._cluster)
        self._owns_client = True
        self._origin = current()
        self._order_cache = None
        self._reset_process_state()

