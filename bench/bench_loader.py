"""The Loader feeding a simulated training loop: samples/s, stall, time to first batch.

A training loop takes a batch, then "computes" for a fixed time (``time.sleep``:
the GIL is free, as while a GPU step runs).  First with no compute, to find each
loader's maximum rate; then with a step sized so that the loop consumes 80 % of
that rate, where a loader that prefetches well should leave the loop almost
never waiting.  Loaders, in the same run, over the same samples:

* stager ``Loader`` over WebDataset-style tar shards striped in the cluster
  (two-level shuffle; the batches of a shuffle window fetched together, chunks
  they mostly cover read whole, the rest batched per data server);
* ``stager.torch.StagerDataLoader(num_workers=2)`` over the same shards;
* stager ``Loader`` over one stager file per sample (same coalescing; full run);
* ``torch.utils.data.DataLoader(num_workers=2)`` over a map-style dataset that
  GETs each sample's own file from nginx (keep-alive, one request per sample);
* webdataset (``DataLoader(num_workers=2)``) streaming the same tar shards from
  nginx over HTTP, with its shuffle buffer.

for 16 KiB and 1 MiB samples.  The cluster (metadata + data servers), nginx and
the loaders share this machine's cores.  Beside them, the stager Loader's stall
measured the plain way a user would (:mod:`bench.plain_stall`): epoch 0 at full
speed gives the maximum rate, epoch 1 is paced at 80 % of it.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import random
import statistics
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from stager import Client, Loader
from stager.testing.nodes import NodeCluster

from . import baselines as B
from . import loader_workers, plain_stall
from .common import KiB, MiB, aim, r2, scratch
from .training_loop import drive, sleep_late

DATA_SERVERS = 3
STAGER_TAR = "stager Loader, tar shards"
PLAIN = "stager Loader, tar shards, plain stall: epoch 0 max, epoch 1 paced"
STAGER_FILES = "stager Loader, file per sample"
STAGER_TORCH = "stager.torch DataLoader(2 workers), tar shards"
TORCH_HTTP = "torch DataLoader(2 workers), HTTP GET per file (nginx)"
WDS = "webdataset + DataLoader(2 workers), tar shards over HTTP (nginx)"
WORKERS_ROW = "stager.torch StagerDataLoader(num_workers={}), tar shards, whole epoch"
FIRST = "stager Loader, plain stall, first epoch of a fresh Loader paced"
LATER = "stager Loader, plain stall, the same Loader's next epoch paced"


@dataclass(frozen=True)
class Size:
    label: str
    sample: int
    batch: int
    samples: int            # in the tar shards, and as local files for nginx
    shards: int
    stager_files: int       # of them also stored as one stager file each (0: not measured)
    batches: int            # batches each loader is measured over (all in one epoch)
    # no-compute runs per loader (the maximum rate is their median), and as many paced
    # runs (the stall is their median)
    runs: int


def sizes(quick: bool) -> list[Size]:
    if quick:
        # 1 MiB: just the 8 batches of 16 it reads (192 MiB was written twice, then put)
        return [Size("16 KiB", 16 * KiB, 256, 4096, 2, 0, 12, 1),
                Size("1 MiB", MiB, 16, 128, 2, 0, 8, 1)]
    return [Size("16 KiB", 16 * KiB, 256, 65536, 8, 16384, 200, 3),
            Size("1 MiB", MiB, 16, 1536, 8, 768, 80, 3)]


# -- data ------------------------------------------------------------------------------
def make_data(root: Path, size: Size) -> None:
    """Shards ``tar/part-N.tar`` and per-sample files ``files/NNNNNNN.bin`` of the same bytes."""
    rng = random.Random(size.sample)
    (root / "tar").mkdir(parents=True)
    (root / "files").mkdir()
    (root / "some").mkdir()
    per = size.samples // size.shards
    for s in range(size.shards):
        with tarfile.open(root / "tar" / f"part-{s:03d}.tar", "w") as tar:
            for i in range(s * per, (s + 1) * per):
                data = rng.randbytes(size.sample)
                info = tarfile.TarInfo(f"{i:07d}.bin")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                (root / "files" / f"{i:07d}.bin").write_bytes(data)
                if i < size.stager_files:
                    (root / "some" / f"{i:07d}.bin").write_bytes(data)


# -- the loaders -------------------------------------------------------------------------------
class StagerCase:
    def __init__(self, meta: str, path: str, size: Size, cache: Path) -> None:
        self.meta, self.path, self.size, self.cache = meta, path, size, cache
        self.loaders: list[Loader] = []

    def __call__(self) -> Iterator[Any]:
        loader = Loader(self.path, meta_url=self.meta, batch_size=self.size.batch, seed=0,
                        index_cache=self.cache, **plain_stall.LOADER)
        self.loaders.append(loader)
        return self._epochs(loader)

    @staticmethod
    def _epochs(loader: Loader) -> Iterator[Any]:
        try:
            while True:
                yield from loader
        finally:
            loader.close()


class HttpFiles:
    """Map-style dataset: sample i is one GET of its own file (keep-alive per worker)."""

    def __init__(self, url: str, n: int) -> None:
        self.url, self.n = url, n
        self.conn: http.client.HTTPConnection | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> bytes:
        if self.conn is None:
            u = urlsplit(self.url)
            self.conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port)
        self.conn.request("GET", f"/files/{i:07d}.bin")
        resp = self.conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status} for sample {i}")
        return body


def torch_http(url: str, size: Size) -> Callable[[], Iterable[Any]]:
    import torch

    def make() -> Iterable[Any]:
        return torch.utils.data.DataLoader(
            HttpFiles(url, size.samples), batch_size=size.batch, shuffle=True, num_workers=2,
            collate_fn=list, drop_last=True, generator=torch.Generator().manual_seed(0),
            multiprocessing_context="fork")
    return make


def stager_torch(meta: str, path: str, size: Size, cache: Path) -> Callable[[], Iterable[Any]]:
    from stager.torch import StagerDataLoader, StagerDataset

    def make() -> Iterable[Any]:
        ds = StagerDataset(path, meta_url=meta, batch_size=size.batch, seed=0,
                           index_cache=cache)
        # forked even on too few cores (no in-process fallback): the row is the
        # workers', beside torch's own 2-worker DataLoader
        return _closing(StagerDataLoader(ds, num_workers=2, fallback=False,
                                         multiprocessing_context="fork"), ds)
    return make


def _closing(loader: Iterable[Any], owner: Any) -> Iterator[Any]:
    try:
        yield from loader
    finally:
        owner.close()


def webdataset_http(url: str, size: Size) -> Callable[[], Iterable[Any]]:
    import torch
    import webdataset as wds

    urls = [f"pipe:curl -s {url}/tar/part-{s:03d}.tar" for s in range(size.shards)]

    def make() -> Iterable[Any]:
        ds = (wds.WebDataset(urls, shardshuffle=len(urls), seed=0, empty_check=False)
              .shuffle(1000).batched(size.batch, collation_fn=list))
        return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                           multiprocessing_context="fork")
    return make


# -- the run ---------------------------------------------------------------------------------
def measure_all(cases: dict[str, tuple[Callable[[], Iterable[Any]], int]],
                size: Size) -> dict[str, dict[str, Any]]:
    """Each loader's figures; ``cases`` maps its name to (factory, batches to read).

    The maximum rate is the median of ``size.runs`` no-compute runs taken in
    rounds, every loader once per round (each round starting one loader later),
    so the loaders compared in a ratio are measured in the same minutes and a
    pause of the shared machine spoils one run of one loader, not its figure."""
    fast: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
    names = list(cases)
    for r in range(size.runs):
        for name in names[r % len(names):] + names[:r % len(names)]:
            make, batches = cases[name]
            fast[name].append(drive(make, len, 0.0, batches))
    return {name: paced(make, size, batches, fast[name])
            for name, (make, batches) in cases.items()}


def paced(make: Callable[[], Iterable[Any]], size: Size, batches: int,
          fast: list[dict[str, float]]) -> dict[str, Any]:
    """The loader's figures from its no-compute runs (``fast``, the first one with
    cold caches) and ``size.runs`` runs at 80 % of their median rate."""
    rate = statistics.median(f["rate"] for f in fast)
    step = size.batch / (0.8 * rate)
    # A paced run lasts about a second, where one pause of the shared machine
    # weighs a percent or more: the stall is the median of a few runs (all kept).
    runs = [drive(make, len, step, batches) for _ in range(size.runs)]
    stalls = [p["stall"] for p in runs]
    return {"rate": rate, "rates": [f["rate"] for f in fast],
            "cpu": statistics.median(f["cpu"] for f in fast),
            "ttfb": fast[0]["ttfb"],
            "ttfb_again": (fast[1] if len(fast) > 1 else runs[0])["ttfb"],
            "step": step, "stall": statistics.median(stalls), "stalls": stalls,
            "paced_rate": statistics.median(p["rate"] for p in runs),
            "late": statistics.median(p["late"] for p in runs),
            "batches": fast[0]["batches"]}


def one_size(tmp: Path, size: Size) -> dict[str, dict[str, Any]]:
    www = tmp / f"www-{size.sample}"
    make_data(www, size)
    cache = tmp / f"index-{size.sample}"
    n = size.batches
    with NodeCluster(tmp / f"cluster-{size.sample}", DATA_SERVERS, mode="loopback") as cluster, \
            B.Nginx(www, tmp / f"nginx-{size.sample}", workers="2") as nginx:
        with Client(cluster.meta_url) as c:
            c.put(www / "tar", "/ds/tar", files_in_flight=8)
            if size.stager_files:
                c.put(www / "some", "/ds/files", files_in_flight=32)
        cases = {
            STAGER_TAR: (StagerCase(cluster.meta_url, "/ds/tar", size, cache), n),
            STAGER_TORCH: (stager_torch(cluster.meta_url, "/ds/tar", size, cache), n),
        }
        if size.stager_files:
            cases[STAGER_FILES] = (StagerCase(cluster.meta_url, "/ds/files", size, cache),
                                   min(n, size.stager_files // size.batch))
        cases[TORCH_HTTP] = (torch_http(nginx.url, size), n)
        with contextlib.suppress(ImportError):
            cases[WDS] = (webdataset_http(nginx.url, size), n)
        return measure_all(cases, size)


def run(quick: bool) -> dict[str, Any]:
    results: dict[str, dict[str, dict[str, Any]]] = {}
    why = B.nginx_missing()
    if why:
        raise RuntimeError(why)
    idle_late = sleep_late(0.005, 200)      # before anything of the benchmark runs
    with scratch("loader") as tmp:
        for size in sizes(quick):
            results[size.label] = one_size(tmp, size)
        results["16 KiB"][PLAIN] = plain_stall.measure(tmp, quick)
        workers = loader_workers.measure(tmp, quick)
    return _result(results, quick, idle_late, workers)


def workers_row(row: str, figures: dict[str, Any], cores: int) -> str:
    """A row's name: ``N forked`` is ``fallback=False``; a count that fell back to the
    main process says so (it is the in-process rate, not the workers')."""
    count, _, forked = row.partition(" ")
    name = WORKERS_ROW.format(count + (", fallback=False" if forked else ""))
    if figures.get("in_process"):
        name += f" [in-process fallback: {cores} cores]"
    return name


def _workers_rows(workers: dict[str, Any]) -> list[list[Any]]:
    """Rows of :mod:`bench.loader_workers`: samples/s per ``num_workers``, and the plain
    stall of a fresh Loader's first epoch and of its next one (other columns empty)."""
    rows = []
    for w, f in workers["workers"].items():
        rows.append(["16 KiB", f"16 KiB: {workers_row(w, f, workers['cores'])}", r2(f["rate"]),
                     " ".join(f"{x:,.0f}" for x in f["rates"])] + [""] * 9)
    for name, key in ((FIRST, "first"), (LATER, "later")):
        rows.append(["16 KiB", f"16 KiB: {name}", "", "", "", "", "", "", "",
                     r2(100 * workers[f"stall_{key}"]),
                     " ".join(f"{100 * x:.2f}" for x in workers[key]), "", ""])
    return rows


def _result(results: dict[str, dict[str, dict[str, Any]]], quick: bool,
            idle_late: float, workers: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for label, figures in results.items():
        for name, f in figures.items():
            sample = 16 * KiB if label == "16 KiB" else MiB
            rows.append([label, f"{label}: {name}", r2(f["rate"]),
                         " ".join(f"{x:,.0f}" for x in f["rates"]),
                         r2(f["rate"] * sample / 1e6), r2(1e6 * f["cpu"]),
                         r2(f["ttfb"]), r2(f["ttfb_again"]), r2(1000 * f["step"]),
                         r2(100 * f["stall"]),
                         " ".join(f"{100 * x:.2f}" for x in f.get("stalls", [f["stall"]])),
                         r2(f["paced_rate"]), r2(1000 * f["late"])])
    rows += _workers_rows(workers)
    small, big = results["16 KiB"], results["1 MiB"]
    ratios = {
        "16 KiB: stager tar / torch HTTP per file": r2(small[STAGER_TAR]["rate"]
                                                        / small[TORCH_HTTP]["rate"]),
        "1 MiB: stager tar / torch HTTP per file": r2(big[STAGER_TAR]["rate"]
                                                       / big[TORCH_HTTP]["rate"]),
    }
    if small[STAGER_TAR]["cpu"]:    # /proc/stat counts 10 ms ticks: a quick run may show none
        ratios["16 KiB: machine CPU per sample, torch HTTP per file / stager tar"] = r2(
            small[TORCH_HTTP]["cpu"] / small[STAGER_TAR]["cpu"])
    ratios["16 KiB: stager.torch 2 workers / torch HTTP per file"] = r2(
        small[STAGER_TORCH]["rate"] / small[TORCH_HTTP]["rate"])
    if WDS in small:
        ratios["16 KiB: stager tar / webdataset HTTP"] = r2(small[STAGER_TAR]["rate"]
                                                            / small[WDS]["rate"])
        ratios["1 MiB: stager tar / webdataset HTTP"] = r2(big[STAGER_TAR]["rate"]
                                                           / big[WDS]["rate"])
    by_workers = {w: f["rate"] for w, f in workers["workers"].items()}
    ratios["16 KiB: StagerDataLoader 2 workers / 0 workers"] = r2(by_workers["2"]
                                                                  / by_workers["0"])
    ratios["16 KiB: StagerDataLoader 2 workers forked (fallback=False) / 0 workers"] = r2(
        by_workers["2 forked"] / by_workers["0"])
    least = min(by_workers["1"], by_workers["2"])
    aims = {
        "16 KiB StagerDataLoader: 1 and 2 workers at least num_workers=0's rate "
        "(as a user gets them: the fallback on)": aim(
            r2(least / by_workers["0"]), ">= 1x", least >= by_workers["0"]),
        "16 KiB plain stall at 80% of max, first epoch of a fresh Loader": aim(
            100 * workers["stall_first"], "< 1 %", workers["stall_first"] < 0.01),
        "16 KiB plain stall at 80% of max, its next epoch": aim(
            100 * workers["stall_later"], "< 1 %", workers["stall_later"] < 0.01),
        "16 KiB stall at 80% of max, benchmark's method (stager tar)": aim(
            100 * small[STAGER_TAR]["stall"], "< 1 %", small[STAGER_TAR]["stall"] < 0.01),
        "16 KiB stall at 80% of max, plain (stager tar)": aim(
            100 * small[PLAIN]["stall"], "< 1 %", small[PLAIN]["stall"] < 0.01),
        "1 MiB stall at 80% of max (stager tar)": aim(
            100 * big[STAGER_TAR]["stall"], "< 2 %", big[STAGER_TAR]["stall"] < 0.02),
        "16 KiB samples/s vs per-file requests": aim(
            ratios["16 KiB: stager tar / torch HTTP per file"], ">= 5x",
            ratios["16 KiB: stager tar / torch HTTP per file"] >= 5),
    }
    return {
        "title": "Loader feeding a simulated training loop (16 KiB and 1 MiB samples)",
        "command": "python -m bench loader" + (" --quick" if quick else ""),
        "columns": ["sample", "loader", "samples/s (no compute)", "samples/s each run", "MB/s",
                    "machine CPU µs/sample",
                    "time to first batch s", "again s", "step ms (80% of max)",
                    "stall % at 80%", "stall % each run",
                    "samples/s at 80%", "sleep late ms/batch at 80%"],
        "rows": rows,
        "ratios": ratios,
        "aims": aims,
        "notes": [
            f"Cluster: metadata + {DATA_SERVERS} data servers as processes on loopback; nginx "
            "with 2 workers serves the same samples as local files (page cache warm); every "
            "reader runs in this process or its DataLoader workers; all share the machine.",
            "Compute is time.sleep (GIL free, as during a GPU step). 'samples/s (no compute)' "
            "is the loader's maximum rate after the first batch: the median of "
            f"{sizes(quick)[0].runs} runs with no compute ('samples/s each run', in order), "
            "taken in rounds with every loader once per round, so the loaders compared in a "
            "ratio are measured in the same minutes; 'MB/s' is of that median. 'machine CPU "
            "µs/sample': the time all cores of the machine were busy (user, nice, system, "
            "irq, softirq from /proc/stat; not idle, iowait or steal) from the first batch to "
            "the end of a no-compute run, per sample, the median of those runs: it counts "
            "the servers (or nginx) and the loader together, and unlike the rate it does not "
            "depend on how long the machine keeps each of them waiting. The step is then sized to "
            "consume 80% of that rate and 'stall %' is the time the loop waited in next() "
            "after the first batch, over the time since the first batch: the median of "
            f"{sizes(quick)[0].runs} such paced runs (each about a second, so one 10 ms pause "
            "of the shared machine weighs 1 %), all listed under 'stall % each run'; 'samples/s at "
            "80%' is their median rate. That rate is below 80% of the maximum by more than "
            "the stall: the loop's sleep itself returns late ('sleep late ms/batch', the "
            f"median of the paced runs; {1000 * idle_late:.2f} ms for a 5 ms sleep on the "
            "machine before the benchmark started anything), as the loop's "
            "thread wakes on two cores kept busy by the servers and the loader's own "
            "threads.",
            "Time to first batch counts from constructing the loader, in its first "
            "no-compute run: for stager it includes "
            "resolving the dataset and indexing the tar shards, which reads every header "
            "window of every shard (cold index cache: 'time to first batch'; 'again' is the "
            "second run, with the shard index cached by file id); for DataLoader it includes "
            "starting the workers.",
            "stager Loader: its I/O thread on uvloop; two-level shuffle (blocks = samples "
            "starting in one 4 MiB chunk, "
            "windows of 8 whole blocks), 16 batches / 256 MiB prefetch fetched in batch order "
            "with up to 32 MiB of reads out at once (two fetch groups of small samples, up to "
            "32 MiB each); glibc's malloc keeps up to 512 MiB of freed memory and serves "
            "samples up to 32 MiB from its heap (STAGER_LOADER_KEEP_FREED). Samples under "
            "512 KiB: the batches of one "
            "shuffle window fetched together (a batch straddling two windows split between "
            "their groups; past 32 MiB a group still takes its own window, up to 64 MiB), "
            "planned as arrays, a chunk they mostly cover read whole (sendfile, CRC32C checked "
            "by the client, the body read a MiB at a time with SO_RCVLOWAT), the rest in one "
            "POST /v1/read per data server; 1 MiB samples: each batch alone, striped reads.",
            "stager.torch: StagerDataLoader(num_workers=2, fallback=False, forked); the workers "
            "share the epoch plan (made before they fork) and read runs of consecutive steps in "
            "turn (about one shuffle window a run), each with a Loader of its own (the same "
            "settings); the main process hands the batches out in step order; sample bytes cross "
            "in shared-memory buffers each worker reuses (SharedBatch), handed out as read-only "
            "memoryviews of them (no copy), the sample dicts pickled without their bytes.",
            f"'{WORKERS_ROW.format('N')}' (bench.loader_workers): one whole epoch per run "
            f"of {loader_workers.samples(quick):,} samples of 16 KiB in tar shards of "
            f"{plain_stall.SHARD:,}, {plain_stall.DATA_SERVERS} data servers, the Loader "
            "settings of the rows above, 0, 1 and 2 workers in rounds (every count once a "
            "round), 1 and 2 both as a user gets them (the in-process fallback on, the row "
            "marked where it applied) and forked anyway (fallback=False); samples/s after "
            "the first batch, the median of the runs. "
            f"'{FIRST}': a fresh Loader's no-compute epoch 0 gives R; another fresh Loader "
            "reads epoch 0 with a sleep of batch / (0.8 R) after each batch, then epoch 1 "
            f"('{LATER}'); stall as in the plain row, the median of the runs.",
            "webdataset: shard shuffle + a 1000-sample shuffle buffer, shards split between "
            "the 2 workers, each shard streamed with curl from nginx.",
            "Every loader is measured over the same number of batches, all inside its first "
            "epoch; the stager file-per-sample row (full run only) reads a subset of the "
            "samples stored one per stager file.",
            f"'{PLAIN}' measures the stall as a user would: one Loader reads epoch 0 with "
            "no compute, which gives its maximum rate R, then epoch 1 with a sleep of "
            "batch / (0.8 R) after each batch; stall = time blocked in next() / wall time, "
            "the first batch of each epoch excluded. On the small-samples benchmark's data: "
            f"{plain_stall.samples(quick):,} samples of 16 KiB in tar shards of "
            f"{plain_stall.SHARD:,}, {plain_stall.DATA_SERVERS} data servers, the same "
            "Loader settings as the rows above; the median of "
            f"{plain_stall.runs(quick)} such pairs of epochs, each with a fresh Loader "
            "('samples/s each run' and 'stall % each run' list them). The other rows use "
            "the benchmark's own method (R from separate no-compute runs, paced runs of "
            f"{sizes(quick)[0].batches} batches inside a fresh Loader's first epoch).",
        ],
        "plot": {"kind": "barh", "x": "loader", "y": ["samples/s (no compute)"],
                 "ylabel": "samples/s", "logy": True},
    }
