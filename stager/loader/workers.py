"""How DataLoader workers of one rank split its steps.

Worker ``w`` of ``k`` takes runs of ``run`` consecutive steps in turn: steps
``w·run … w·run + run - 1``, then ``(w + k)·run …``.  Consecutive steps of a
two-level shuffle draw on the same shuffle window, so with ``run`` about the
steps of one window a worker's fetch groups read whole windows' chunks, as a
single Loader does; split round-robin (``run`` 1), each worker read half of
every window's samples, in fragments, and both read the same chunks.  The
adapter (:mod:`stager.torch`) puts the workers' batches back in step order.
"""

from __future__ import annotations

import os

from ..plans.partition import WORKER_SPLITS


def worker_steps(total: int, worker: int, workers: int, run: int = 1) -> list[int]:
    """The steps (of ``total`` in the pass) worker ``worker`` of ``workers`` reads,
    in order: runs of ``run`` steps, the workers taking them in turn."""
    WORKER_SPLITS["round_robin"]([], workers, worker)  # checks the numbers
    if run < 1:
        raise ValueError(f"a worker run must be at least 1 step, not {run}")
    if run == 1:
        return list(range(worker, total, workers))
    return [i for i in range(total) if (i // run) % workers == worker]


def run_length(window: int, batch_size: int, world_size: int, prefetch_batches: int) -> int:
    """Steps per worker run: the rank's steps in one shuffle window of ``window``
    positions, at most half the prefetch window (the main process holds up to a
    run of one worker's batches while it hands out the other's)."""
    per_window = window / (batch_size * world_size)
    return max(1, min(prefetch_batches // 2, int(round(per_window))))


#: CPU per sample of a tar batch read in a DataLoader worker and handed to the main
#: process, over the same read in the main process alone: 1.5 with one worker
#: (17-21 against 12-14 µs per 16 KiB sample, bench.loader_workers' data on the
#: 2-core machine).  The worker path costs the process start, a second client and
#: its connections, the copy into shared memory and the hand-over of every batch.
#: Two workers there cost 2.1 (24-28 µs), and the data servers 1.6 times their CPU
#: per sample (the same bytes and requests): two client processes and the servers
#: contend for the 2 cores, which workers with a core each do not.
WORKER_CPU = 1.5


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a Slurm or container
    cpuset), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:              # no affinity masks (macOS, Windows)
        return os.cpu_count() or 1


def workers_pay(workers: int, cores: int) -> bool:
    """Whether ``workers`` DataLoader workers can read faster than the main process
    alone on ``cores`` cores.

    In one process the loader reads on about one core (its I/O thread holds the
    GIL), so workers must bring more than :data:`WORKER_CPU` cores between them to
    gain: at least two workers, and a core for each beside the main process's
    (where the training loop runs).  One worker, or two on two cores, only move
    the same work to another process at 1.5 to 2.1 times its cost."""
    return min(workers, cores - 1) > WORKER_CPU
