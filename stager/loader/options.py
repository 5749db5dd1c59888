"""The Loader's options, grouped by role into small frozen values.

``Loader(source, batch_size=..., prefetch_batches=..., ...)`` keeps its flat
keyword arguments (what users and the PyTorch adapter call it with);
:func:`group_options` sorts them into these groups, checking and filling in
defaults once, so the code that reads an option finds it in the group of its
role: which batches this rank reads (:class:`Sharding`), in what order
(:class:`Ordering`), how far ahead and how much is read (:class:`Prefetch`),
what runs on the samples (:class:`Decoding`) and what is reported
(:class:`Telemetry`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import Config
from ..plans.partition import PARTITIONS
from .fetch import FetchOptions
from .report import check_interval, job_to_report


@dataclass(frozen=True)
class Sharding:
    """Which batches this rank reads: ``partition`` names the policy that gives
    rank ``rank`` of ``world_size`` its positions of each epoch's order."""

    batch_size: int
    rank: int = 0
    world_size: int = 1
    drop_last: bool = True
    partition: str = "interleaved"

    def __post_init__(self) -> None:
        PARTITIONS[self.partition](0, 0, self.world_size, self.rank, self.batch_size,
                                   self.drop_last)      # checks the numbers


@dataclass(frozen=True)
class Ordering:
    """How an epoch's order is drawn: ``order`` names the policy (None: the
    default for ``shuffle``); ``block`` (samples per block) and ``window``
    (positions per window) tune the two-level shuffle (None: from the dataset)."""

    seed: int = 0
    shuffle: bool = True
    order: str | None = None
    block: int | None = None
    window: int | None = None

    @property
    def policy(self) -> str:
        """The order policy: the one asked for, else the default for ``shuffle``."""
        return self.order or ("window_of_blocks" if self.shuffle else "sequential")


@dataclass(frozen=True)
class Prefetch:
    """What is read ahead of the consumer: at most ``batches`` batches and
    ``bytes`` bytes held; with ``next_epoch``, on into the next epoch when a
    pass ends; with ``fill``, a new pipeline's first batch waits until the window
    is full (so the later ones need not); ``fetch`` tunes the reads themselves."""

    batches: int = 6
    bytes: int = 256 << 20
    next_epoch: bool = True
    fetch: FetchOptions = field(default_factory=FetchOptions)
    fill: bool = True


@dataclass(frozen=True)
class Decoding:
    """What runs on the samples, in a pool of ``threads``: ``map`` on each sample,
    ``collate`` on each batch's list of them; ``output`` is the form of
    columnar batches (``"arrow"`` or ``"numpy"``)."""

    map: Callable[[Any], Any] | None = None
    collate: Callable[[list[Any]], Any] | None = None
    output: str = "arrow"
    threads: int = 1

    @property
    def plain(self) -> bool:
        """Whether batches are the format's own (no ``map``, no ``collate``)."""
        return self.map is None and self.collate is None


@dataclass(frozen=True)
class Telemetry:
    """The job this loader reports to the metadata server as (None: it does not
    report), and every how many seconds."""

    job: str | None = None
    interval: float = 5.0


def group_options(config: Config, environ: Mapping[str, str], *, batch_size: int,
                  rank: int = 0, world_size: int = 1, seed: int = 0, shuffle: bool = True,
                  drop_last: bool = True, map: Callable[[Any], Any] | None = None,
                  collate: Callable[[list[Any]], Any] | None = None, output: str = "arrow",
                  order: str | None = None, shuffle_block: int | None = None,
                  shuffle_window: int | None = None, partition: str = "interleaved",
                  prefetch_batches: int = 6, prefetch_bytes: int = 256 << 20,
                  decode_threads: int | None = None, fetch: FetchOptions | None = None,
                  prefetch_next_epoch: bool = True, prefetch_fill: bool = True,
                  job: str | None = None,
                  report: bool | None = None, report_interval: float | None = None
                  ) -> tuple[Sharding, Ordering, Prefetch, Decoding, Telemetry]:
    """The Loader's keyword arguments (see :class:`~stager.loader.Loader`) by role,
    checked, with the defaults of ``config`` and the environment filled in."""
    interval = config.report_interval if report_interval is None else report_interval
    return (Sharding(batch_size, rank, world_size, drop_last, partition),
            Ordering(seed, shuffle, order, shuffle_block, shuffle_window),
            Prefetch(max(1, prefetch_batches), max(1, prefetch_bytes), prefetch_next_epoch,
                     fetch or FetchOptions(), bool(prefetch_fill)),
            Decoding(map, collate, output,
                     max(1, decode_threads or min(4, os.cpu_count() or 1))),
            Telemetry(job_to_report(report, job, config.job, environ),
                      check_interval(interval)))
