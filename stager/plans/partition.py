"""Who reads which positions of the epoch: pure functions, registered by name.

The global cursor counts positions of the epoch order consumed by *all* ranks
together.  One global *step* is one batch on every rank, ``world × batch``
positions; rank ``r`` takes the ``r``-th run of ``batch`` positions of each
step.  A state saved after ``k`` steps has cursor ``start + k × world × batch``,
whatever ``world`` was, so a job of another size starts from the same cursor
and covers the rest of the epoch with nothing missed and nothing repeated.

Inside a rank, DataLoader workers split the rank's steps again (worker ``w`` of
``k`` takes steps ``w, w + k, …``); the DataLoader hands them back round-robin,
which is the step order again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..policies import Registry


@dataclass(frozen=True)
class Span:
    """Positions ``[start, stop)`` of the epoch order: one batch of one rank."""

    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


#: (total, cursor, world, rank, batch, drop_last) -> this rank's batches, in step order
Partition = Callable[[int, int, int, int, int, bool], list[Span]]
PARTITIONS: Registry[Partition] = Registry("partition")

#: (steps, workers, worker) -> that worker's steps
WorkerSplit = Callable[[Sequence[Span], int, int], list[Span]]
WORKER_SPLITS: Registry[WorkerSplit] = Registry("worker split")


partition_policy = PARTITIONS.register


worker_split = WORKER_SPLITS.register


def check_rank(world: int, rank: int, batch: int) -> None:
    if world < 1:
        raise ValueError(f"world_size must be at least 1, not {world}")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside world_size {world}")
    if batch < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch}")


@partition_policy("interleaved")
def interleaved(total: int, cursor: int, world: int, rank: int, batch: int,
                drop_last: bool) -> list[Span]:
    """Step ``k`` gives rank ``r`` positions ``cursor + k·W·B + r·B`` … ``+ B``.

    With ``drop_last`` the last partial step is dropped, so every rank has the
    same number of batches (DDP never waits on a rank that ran out).  Without
    it, the tail is cut into ``world`` nearly equal runs, one short batch per
    rank (empty runs are skipped; rank 0 always has one when there is a tail,
    so its state is the one to save), and the ranks' union is the whole epoch.
    """
    check_rank(world, rank, batch)
    cursor = min(max(cursor, 0), total)
    step = world * batch
    full = (total - cursor) // step
    out = [Span(cursor + k * step + rank * batch, cursor + k * step + (rank + 1) * batch)
           for k in range(full)]
    tail = total - cursor - full * step
    if tail and not drop_last:
        base = cursor + full * step
        share, extra = divmod(tail, world)     # the first `extra` ranks take one more
        lo = base + rank * share + min(rank, extra)
        hi = lo + share + (1 if rank < extra else 0)
        if hi > lo:
            out.append(Span(lo, hi))
    return out


@worker_split("round_robin")
def round_robin(steps: Sequence[Span], workers: int, worker: int) -> list[Span]:
    """Worker ``w`` of ``k`` takes steps ``w, w + k, …`` (what DataLoader interleaves back)."""
    if workers < 1 or not 0 <= worker < workers:
        raise ValueError(f"worker {worker} is outside {workers} workers")
    return list(steps[worker::workers])


def cursor_after(total: int, cursor: int, world: int, batch: int, steps: int,
                 plan_length: int) -> int:
    """The global cursor once every rank consumed ``steps`` of its ``plan_length`` batches."""
    if steps >= plan_length:
        return total
    return min(total, cursor + steps * world * batch)
