"""A Loader over cached files tells the metadata server its plan, and where it is.

Plan-aware eviction (:mod:`stager.meta.cache.plans`) needs every rank's future
reads, which the metadata server derives from the plan's parameters and the
dataset's sample extents with the same order and partition functions
(:mod:`stager.plans`).  Rank 0 (worker 0) of a Loader whose dataset has files of an
attached directory registers them at the start of each pass (covering that epoch
and the next); every rank then sends where its reads are
(:meth:`~.loader.Loader.io_position`), the job about 100 times a second in all (the
slowest rank is the plan's now).  All of it runs on the client's I/O loop and never
in the training loop's way: a refusal or a metadata server that is down costs a log
line, not an exception.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import StagerError
from ..plans.registered import plan_id
from ..protocol.cache import PlanPosition, PlanRequest

if TYPE_CHECKING:
    from ..client import Client
    from .formats.base import Index
    from .loader import Loader

log = logging.getLogger("stager.loader")
POSITION_EVERY = 0.01       # seconds between one rank's position reports, per rank of
                            # the job (a job sends about 100 a second), at least 0.05
MAX_EXTENTS = 4_000_000     # a larger dataset is not registered (the server's limit)
PLAN_TTL = 600.0            # a registration outlives its last report by this much
CLOSE_TIMEOUT = 1.0         # close() waits at most this long for reports in flight


def dataset_extents(index: Index) -> dict[str, Any] | None:
    """The dataset as the metadata server's plan book reads it: file ids, chunk
    sizes, and each sample's extents (``None`` when it is too large to register)."""
    n = len(index)
    units = np.asarray(index.units_of(np.arange(n, dtype=np.int64)), dtype=np.int64)
    distinct = np.unique(units)
    spans = index.spans_of(distinct)
    unit = np.asarray(spans.unit if spans.unit is not None else distinct, dtype=np.int64)
    by_unit = np.argsort(unit, kind="stable")
    bounds = np.searchsorted(unit[by_unit], np.append(distinct, np.iinfo(np.int64).max))
    k = np.searchsorted(distinct, units)            # each sample's unit, as a row
    count = bounds[k + 1] - bounds[k]
    if int(count.sum()) > MAX_EXTENTS:
        return None
    sample = np.repeat(np.arange(n, dtype=np.int64), count)
    within = np.arange(len(sample), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    ext = by_unit[np.repeat(bounds[k], count) + within]
    files = index.files
    return {"files": [f.file_id or "" for f in files],
            "chunk_sizes": [f.layout.chunk_size if f.layout is not None else 1 for f in files],
            "samples": n, "sample": sample.tolist(), "file": spans.file[ext].tolist(),
            "offset": spans.offset[ext].tolist(), "length": spans.length[ext].tolist()}


class PlanRegistrar:
    def __init__(self, loader: Loader, client: Client) -> None:
        self.loader = loader
        self.client = client
        # every rank says where it reads (the slowest is the plan's now); rank 0
        # registers the plan.  A DataLoader's workers: worker 0 speaks for the rank.
        self.enabled = (loader.workers[0] == 0
                        and any(f.layout is not None and f.layout.cached
                                for f in loader.index.files))
        self.registers = loader.rank == 0
        self.id = plan_id(loader.source, loader.fingerprint(), loader.world_size,
                          loader.batch_size)
        self._dataset: dict[str, Any] | None = None
        self._last = 0.0
        self._failed = False
        self._pending: list[cf.Future[Any]] = []

    def begin(self, epoch: int, cursor: int) -> None:
        """A pass starts at ``(epoch, cursor)``: register the plan of it and the next
        (rank 0), or say where this rank starts (the others)."""
        if not self.enabled or self._failed:
            return
        if not self.registers:
            self._last = time.monotonic()
            self._send(self.client.aio.plan_position(self.id, epoch, cursor,
                                                     self.loader.rank))
            return
        if self._dataset is None:
            self._dataset = dataset_extents(self.loader.index)
            if self._dataset is None:
                log.info("loader: dataset too large to register its plan; eviction of %s "
                         "falls back to the cache's policy without it", self.loader.source)
                self.enabled = False
                return
        ld = self.loader
        plan = {"seed": ld.seed, "epoch": epoch, "epochs": 2, "world_size": ld.world_size,
                "batch_size": ld.batch_size, "window": ld.window,
                "blocks": np.asarray(ld.blocks).tolist(), "cursor": cursor,
                "order": ld.order, "partition": ld.sharding.partition,
                "drop_last": ld.sharding.drop_last}
        request = PlanRequest(plan, self._dataset, PlanPosition(epoch, cursor), PLAN_TTL)
        self._last = time.monotonic()
        self._send(self.client.aio.register_plan(self.id, request))

    def at(self) -> None:
        """The consumer took a batch: say where the job is (every ``POSITION_EVERY`` s)."""
        every = max(0.05, POSITION_EVERY * self.loader.world_size)
        if not self.enabled or self._failed or time.monotonic() - self._last < every:
            return
        self._last = time.monotonic()
        epoch, cursor = self.loader.io_position()
        self._send(self.client.aio.plan_position(self.id, epoch, cursor, self.loader.rank))

    def close(self) -> None:
        """Wait a moment for the reports in flight (a report sent after the client
        closed would open a session nobody closes), then drop them."""
        pending = [f for f in self._pending if not f.done()]
        cf.wait(pending, timeout=CLOSE_TIMEOUT)
        for f in pending:
            f.cancel()
        self.enabled = False

    def _send(self, work: Any) -> None:
        future = asyncio.run_coroutine_threadsafe(work, self.client.loop)
        self._pending = [f for f in self._pending if not f.done()] + [future]

        def done(f: Any) -> None:
            error = f.exception()
            if isinstance(error, StagerError) and error.status in (400, 403):
                log.warning("loader: the plan of %s was refused (%s); not registering it "
                            "again", self.loader.source, error)
                self._failed = True
            elif error is not None:
                log.info("loader: plan report failed: %s", error)
        future.add_done_callback(done)
