"""The cache benchmark's runs on a real cluster (part two of ``python -m bench cache``).

The data lake is :mod:`bench.cache_source` serving one file per sample, run inside
a network namespace whose link is capped with ``tc tbf`` (:mod:`stager.testing.netns`)
as a remote bucket's bandwidth would be, or on loopback, uncapped, where
namespaces cannot be made (and at the quick size).  The cluster is ``stager up``
in a subprocess (:class:`~stager.testing.cluster.ProcessCluster`: a metadata
server and data servers on loopback, uncapped); its metadata server fills the
attached files' chunks from the source.

A file per sample, not tar shards: a Loader indexes a tar shard by reading every
member's header, and over an attached shard those reads fill every chunk before
the first batch, so the first epoch would read a cache already full.

* :func:`throughput`: the first and second epochs of a Loader over the attached
  dataset beside the same dataset staged with ``stager stage`` (the second epoch
  also by a fresh Loader, whose client learns the CRC32Cs from its plan's
  registration), and the
  second epoch's stall the plain way (:mod:`bench.plain_stall`'s method).
* :func:`policy_run`: a dataset 1.5x ``--cache-limit`` read for two shuffled
  epochs by a Loader of world size 2, under one eviction policy: the source's
  requests and the cache's hit ratio of each epoch.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec

from stager import Client, Loader
from stager.config import load_config
from stager.protocol.cache import Attachment
from stager.testing.cluster import ProcessCluster
from stager.testing.netns import NetnsFabric, netns_unavailable

from .bench_stage import stage
from .cache_source import CountingSource
from .common import cpu_seconds, random_blocks
from .plain_stall import LOADER
from .training_loop import drive

DATA_SERVERS = 3
EPOCH = 1 << 30                 # batches: as many as the epoch has
SOURCE_SAMPLE = 64              # files fsspec gets to measure the source's own read rate
PACED = 0.8                     # the paced epoch consumes this share of the maximum rate
# a Loader kept for a second epoch would read it ahead at the end of its first, while the
# others ran: each epoch is timed reading its own samples, none read before
ONE_EPOCH = {"prefetch_next_epoch": False}
SECONDS = ("staged", "learnt", "fresh")     # the second epochs a round times, in turn,
REPEATS = 3                                 # this many times over (each is a second or two)
READ_AHEAD = 4                  # the policy runs' ranks read ahead 1/READ_AHEAD of the cache


def write_samples(root: Path, files: int, size: int, seed: int = 0) -> dict[str, int]:
    """``files`` random files of ``size`` bytes under ``root``: name -> CRC-32."""
    root.mkdir(parents=True)
    crcs = {}
    for i in range(files):
        data = b"".join(random_blocks(size, seed * 1_000_003 + i))
        (root / f"s{i:06d}.bin").write_bytes(data)
        crcs[f"s{i:06d}.bin"] = zlib.crc32(data)
    return crcs


@contextmanager
def lake(root: Path, cap_mbit: float | None) -> Iterator[tuple[CountingSource, str | None]]:
    """The counting source serving ``root``, behind a link capped at ``cap_mbit``;
    yields (the source, why it is on loopback uncapped instead, or None)."""
    why = "asked for no cap" if cap_mbit is None else netns_unavailable()
    if why is not None:
        with CountingSource(root) as source:
            yield source, why
        return
    with NetnsFabric(1, rate_mbit=cap_mbit) as fabric, CountingSource(
            root, host=fabric.nodes[0].address, prefix=fabric.netns_argv(0, [])) as source:
        yield source, None


def attachment(client: Client, path: str) -> Attachment:
    [found] = [a for a in client.attachments() if a.path == path]
    return found


def source_rate(url: str, names: list[str], tmp: Path) -> float:
    """Bytes/s of fsspec ``get`` of ``names`` below ``url``: the source's own read rate."""
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    start = time.perf_counter()
    fs.get([f"{url}/{n}" for n in names], [str(tmp / n) for n in names])
    seconds = time.perf_counter() - start
    nbytes = sum((tmp / n).stat().st_size for n in names)
    for n in names:
        (tmp / n).unlink()
    return nbytes / seconds


def loader(meta_url: str, path: str, batch: int, **options: Any) -> Loader:
    return Loader(path, meta_url=meta_url, batch_size=batch, format="files",
                  **(LOADER | {"seed": 0} | options))


def epoch(it: Loader, number: int, step: float = 0.0) -> dict[str, float]:
    """:func:`bench.training_loop.drive` over epoch ``number`` of ``it``."""
    it.set_epoch(number)
    return drive(lambda: it, len, step, EPOCH)


@dataclass(frozen=True)
class Epoch:
    """One epoch of a Loader: its figures (``drive``'s), the chunk reads it made (a
    sample is a one-chunk file), and what it cost the source and the cache
    (differences of the counters across the epoch)."""

    figures: dict[str, float]
    reads: int
    source: Counter[str]
    hits: int
    misses: int

    @property
    def hit_ratio(self) -> float:
        """The reads the source did not serve: 1 - its ranged GETs / the reads (a
        trace simulation's hit ratio, whatever fetched the chunk first)."""
        return 1 - self.source["ranged GET"] / max(1, self.reads)

    @property
    def status_hit_ratio(self) -> float:
        """As ``stager status`` counts: reads that found their chunk filled, which
        includes a chunk the metadata server filled ahead of a registered plan."""
        return self.hits / max(1, self.hits + self.misses)


class Counted:
    """Differences of the source's and an attachment's counters between looks."""

    def __init__(self, source: CountingSource, client: Client, path: str) -> None:
        self.source, self.client, self.path = source, client, path
        self.last = self._now()

    def _now(self) -> tuple[Counter[str], int, int]:
        a = attachment(self.client, self.path)
        return self.source.counts(), a.hits, a.misses

    def epoch(self, figures: dict[str, float], reads: int) -> Epoch:
        (c0, h0, m0), now = self.last, self._now()
        self.last = now
        return Epoch(figures, reads, now[0] - c0, now[1] - h0, now[2] - m0)


def throughput(cluster: ProcessCluster, source: CountingSource, data: Path, tmp: Path,
               batch: int, rounds: int) -> dict[str, Any]:
    """The attached dataset's epochs beside the staged copy's, in one cluster.

    The staged copy's first epoch, by a Loader kept open.  Then ``rounds`` times
    (medians compared, so a pause of the shared machine spoils one run, not a
    ratio): the source read alone; a first epoch over a fresh attachment of it (the
    cold read; the earlier attachment detached) by a new Loader; then, side by side
    (``REPEATS`` times over, each time in another order), the second epoch of the
    staged copy (by its Loader), of the attached copy by the
    Loader that read its first epoch (as a training job reads its second epoch: its
    client learnt the chunks' CRC32Cs, ``learnt``), and by a fresh Loader (a new
    client, which learns them from its plan's registration, ``fresh``).
    Last, the plain stall of the attached copy's second epoch, by the last round's
    job Loader again.  Each epoch's figures carry the metadata server's CPU seconds
    (``meta cpu``)."""
    meta_url, meta = cluster.meta_url, cluster.meta_pid()

    def run(it: Loader, number: int, step: float = 0.0) -> dict[str, float]:
        before = cpu_seconds(meta)
        figures = epoch(it, number, step)
        return figures | {"meta cpu": cpu_seconds(meta) - before}

    def reads(figures: dict[str, float]) -> int:
        return int(figures["batches"]) * batch          # whole batches (drop_last)

    url = f"{source.url}/{data.name}"
    names = sorted(p.name for p in data.iterdir())
    seconds, copied = stage(meta_url, f"file://{data}", "/staged")
    assert copied == len(names), (copied, len(names))
    own: list[float] = []
    cold: list[Epoch] = []
    staged: list[dict[str, float]] = []
    learnt: list[Epoch] = []
    fresh: list[Epoch] = []
    with ExitStack() as stack:
        client = stack.enter_context(Client(meta_url, config=load_config(env={})))
        staged_loader = stack.enter_context(loader(meta_url, "/staged", batch, **ONE_EPOCH))
        staged_first = run(staged_loader, 0)
        jobs: list[Loader] = []         # the open job Loader (closed however this ends)
        stack.callback(lambda: [j.close() for j in jobs])
        for k in range(rounds):
            own.append(source_rate(url, names[:SOURCE_SAMPLE], tmp))
            if jobs:
                jobs.pop().close()
                client.detach(f"/attached-{k - 1}")
            attached = f"/attached-{k}"
            client.attach(url + "/", attached)
            counted = Counted(source, client, attached)
            job = loader(meta_url, attached, batch, **ONE_EPOCH)
            jobs.append(job)
            cold.append(counted.epoch(figures := run(job, 0), reads(figures)))
            # the fills just wrote the attached copy: its writeback must not compete with
            # the timed second epochs (the staged copy's was done long before)
            os.sync()
            for which in _turns(k):
                if which == "staged":
                    staged.append(run(staged_loader, 1))
                elif which == "learnt":
                    learnt.append(counted.epoch(figures := run(job, 1), reads(figures)))
                else:
                    with loader(meta_url, attached, batch, **ONE_EPOCH) as it:
                        fresh.append(counted.epoch(figures := run(it, 1), reads(figures)))
        # the plain stall: the second epoch's maximum rate (above), then the second
        # epoch again, a sleep after each batch sized to consume PACED of that rate
        step = batch / (PACED * statistics.median(w.figures["rate"] for w in learnt))
        paced = counted.epoch(figures := run(job, 1, step), reads(figures))
    return {"source": own, "stage seconds": seconds, "staged first": staged_first,
            "staged": staged, "cold": cold, "warm": learnt, "fresh": fresh, "paced": paced,
            "step": step}


def _turns(k: int) -> list[str]:
    """The second epochs round ``k`` times: :data:`SECONDS` ``REPEATS`` times over,
    each time starting with the next one (no place in the round favours one)."""
    out: list[str] = []
    for r in range(k * REPEATS, (k + 1) * REPEATS):
        out += SECONDS[r % 3:] + SECONDS[:r % 3]
    return out


@dataclass(frozen=True)
class PolicyRun:
    """Each epoch's costs under one policy, and the samples as the ranks received
    them (file numbers, merged by time), the first epoch's ``second`` first."""

    epochs: list[Epoch]
    trace: list[int]
    second: int


def policy_run(source: CountingSource, data: Path, crcs: dict[str, int], tmp: Path, *,
               policy: str, limit: int, batch: int, world: int = 2) -> PolicyRun:
    """Two shuffled epochs of the attached ``data`` by ``world`` Loader ranks on a
    cluster with ``--cache-limit limit`` and ``cache_policy`` ``policy``; every
    sample checked against its CRC-32 (the ranks meet between epochs; a rank does
    not read ahead into the next epoch, and all of them together read ahead at most
    a quarter of the cache: what was read ahead must still be there when used)."""
    env = {"STAGER_CACHE_POLICY": policy}
    with ProcessCluster(tmp / f"cluster-{policy}", DATA_SERVERS, env=env,
                        up_args=["--cache-limit", str(limit)]) as cluster, \
            Client(cluster.meta_url, config=load_config(env={})) as client:
        client.attach(f"{source.url}/{data.name}/", "/lake")
        counted = Counted(source, client, "/lake")
        epochs: list[Epoch] = []
        at_end: list[int] = []
        marks: list[int] = []           # samples received when the ranks met
        received: list[tuple[float, int]] = []
        failed: list[BaseException] = []
        started = [time.perf_counter()]

        def between() -> None:           # the last rank to finish an epoch runs this
            now = time.perf_counter()
            reads = len(received) - (marks[-1] if marks else 0)
            epochs.append(counted.epoch({"seconds": now - started[0]}, reads))
            at_end.append(attachment(client, "/lake").cached_bytes)
            marks.append(len(received))
            started[0] = time.perf_counter()

        meet = threading.Barrier(world, action=between)

        def rank(r: int) -> None:
            try:
                with loader(cluster.meta_url, "/lake", batch, rank=r, world_size=world,
                            seed=7, drop_last=False, prefetch_next_epoch=False,
                            prefetch_bytes=limit // READ_AHEAD // world) as it:
                    for e in (0, 1):
                        it.set_epoch(e)
                        for b in it:
                            for s in b:
                                if zlib.crc32(s["data"]) != crcs[s["__key__"]]:
                                    raise AssertionError(f"{s['__key__']}: wrong bytes")
                                received.append((time.perf_counter(),
                                                 int(s["__key__"][1:-4])))
                        meet.wait()
            except BaseException as exc:
                failed.append(exc)
                meet.abort()

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failed:
            raise failed[0]
        if max(at_end) > limit:
            raise AssertionError(f"{policy}: {max(at_end)} bytes cached at an epoch's end, "
                                 f"over the limit of {limit}")
    received.sort()         # every first-epoch sample came before the ranks met
    return PolicyRun(epochs, [k for _, k in received], marks[0])
