"""The fast tier as a cache (issue 28): eviction policies side by side on one dataset.

The dataset is tar shards 1.5x the cache, read for two shuffled epochs by a
Loader plan with world size 2 (:func:`bench.sim_eviction.scenario`).  Each part
of the benchmark gives rows of the same columns, one per policy:

* ``trace_comparison``: the plan's chunk reads replayed through each policy of
  :mod:`stager.eviction` (:func:`bench.sim_eviction.compare`): ``plan`` by the
  next uses the metadata server derives from the registered plan's parameters,
  ``lru`` and ``s3fifo`` by the past, ``belady`` by the recorded trace's own
  future (the offline optimum).  A simulation of the decisions, no servers.

* ``cluster_epochs``: on a real cluster (:mod:`bench.cache_cluster`), a dataset
  attached from an HTTP source behind a link capped with ``tc`` in a network
  namespace: the Loader's first epoch against the link's line rate, its second
  beside the same dataset staged with ``stager stage``, and the second epoch's
  stall the plain way.
* ``cluster_policies``: on a real cluster per policy, a dataset 1.5x
  ``--cache-limit`` attached from the same source and read for two shuffled
  epochs by a Loader of world size 2: source requests counted at the source,
  the cache's hit ratio.  ``plan`` joins them once the Loader registers its plan
  with the metadata server (without a registered plan the setting is LRU).

A part leaves the columns it does not measure empty.  At the quick size the
cluster parts run on loopback with an uncapped source (no root needed), tiny.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import Any

from stager.config import load_config
from stager.eviction import Uses, simulate
from stager.protocol.routes import ROUTES
from stager.testing.cluster import ProcessCluster

from .cache_cluster import (
    DATA_SERVERS,
    PACED,
    REPEATS,
    SOURCE_SAMPLE,
    Epoch,
    PolicyRun,
    lake,
    policy_run,
    throughput,
    write_samples,
)
from .common import MB, GiB, KiB, MiB, aim, median, r2, scratch
from .sim_eviction import POLICIES, compare, scenario

COLUMNS = ["case", "hit ratio", "source requests", "source GiB", "epoch 2 hit ratio",
           "epoch 2 source requests", "samples/s", "MB/s", "stall %"]
AIM_OF_OPTIMUM = 0.95           # plan's hit ratio / belady's
AIM_OVER_LRU = 1.5              # plan's hit ratio / lru's
PER_CHUNK = 32                  # samples a 4 MiB chunk holds on average
CAP_MBIT = 400                  # the attached source's link
SAMPLE = MiB                    # bytes of a sample of the cluster epochs
AIM_OF_LINE = 0.9               # attached epoch 1's MB/s / the link's line rate
AIM_OF_STAGED = 0.9             # attached epoch 2's samples/s / the staged copy's
AIM_STALL = 0.01                # attached epoch 2's plain stall


def trace_comparison(quick: bool) -> dict[str, Any]:
    """Part one: the policies over the plan's trace (see the module docstring)."""
    chunks = 192 if quick else 1536
    s = scenario(chunks, PER_CHUNK)
    mean = 4 * MiB // PER_CHUNK
    got = compare(s)
    rows = []
    for policy in POLICIES:
        whole = got.whole[policy]
        ratio, requests = got.second_epoch(policy)
        rows.append(_row(f"{policy} (simulated)", **{
            "hit ratio": round(whole.hit_ratio, 4), "source requests": whole.misses,
            "source GiB": r2(whole.fetched / GiB), "epoch 2 hit ratio": round(ratio, 4),
            "epoch 2 source requests": requests}))
    hit = {p: got.whole[p].hit_ratio for p in POLICIES}
    second = {p: got.second_epoch(p) for p in POLICIES}
    of_optimum, over_lru = hit["plan"] / hit["belady"], hit["plan"] / hit["lru"]
    notes = [
        f"Simulated: {len(s.sizes):,} chunks of 4 MiB in {len(s.dataset.files)} tar-like "
        f"shards ({s.nbytes / GiB:.2f} GiB, {s.dataset.samples:,} samples of "
        f"{mean // 2 // KiB}-{mean * 3 // 2 // KiB} KiB end to end, so many cross a chunk "
        f"boundary), a cache of "
        f"{s.capacity / GiB:.2f} GiB; two epochs of the default order (window_of_blocks, "
        f"a block per chunk of a shard, window {s.plan['window']} samples), world size 2, "
        f"batch 32: {got.reads:,} chunk reads (each chunk once per batch that reads it). "
        "No server, no network: the decisions alone.",
        "plan: furthest next use by the plan the metadata server derives from the "
        "Loader's registered parameters and the samples' extents "
        "(stager.plans.registered); belady: the same rule fed the trace's own future "
        "(the offline optimum); lru and s3fifo: stager.eviction's.",
        "A chunk is read by the few batches of its shuffle window in a row, and all but "
        "the first of those reads hit under every policy, so hit ratios sit close "
        "together; the policies differ in source requests (epoch 2: "
        f"lru {second['lru'][1]:,}, plan {second['plan'][1]:,}). By hit ratio the "
        f"optimum itself reaches {hit['belady'] / hit['lru']:.2f}x LRU's here, the most "
        f"any policy can: the {AIM_OVER_LRU}x aim is out of reach by this measure.",
        "The (simulated) rows are a simulation of the decisions only; the (cluster) "
        "rows below measure the servers.",
    ]
    return {
        "rows": rows,
        "ratios": {
            "simulated: plan / belady, hit ratio": r2(of_optimum),
            "simulated: plan / lru, hit ratio": r2(over_lru),
            "simulated: lru / plan, source requests": r2(
                got.whole["lru"].misses / got.whole["plan"].misses),
            "simulated: lru / plan, epoch 2 source requests": r2(
                second["lru"][1] / max(1, second["plan"][1])),
        },
        "aims": {
            "simulated: plan / belady, hit ratio": aim(
                of_optimum, f">= {AIM_OF_OPTIMUM}", of_optimum >= AIM_OF_OPTIMUM),
            "simulated: plan / lru, hit ratio": aim(
                over_lru, f">= {AIM_OVER_LRU}", over_lru >= AIM_OVER_LRU),
        },
        "notes": notes,
    }


def _row(case: str, **cells: Any) -> list[Any]:
    """A row of :data:`COLUMNS` with ``cells`` by column name, the rest left empty."""
    return [case, *(cells.get(c, "") for c in COLUMNS[1:])]


def cluster_epochs(quick: bool) -> dict[str, Any]:
    """Part two: an attached dataset's first and second epochs on a real cluster,
    beside the same dataset staged, and the second epoch's plain stall."""
    files, batch, rounds = (24, 4, 1) if quick else (512, 16, 3)
    with scratch("cache") as tmp:
        data = tmp / "lake" / "data"
        write_samples(data, files, SAMPLE)
        os.sync()       # the new files' writeback must not compete with the timed runs
        with lake(tmp / "lake", None if quick else CAP_MBIT) as (source, uncapped), \
                ProcessCluster(tmp / "cluster", DATA_SERVERS) as cluster:
            got = throughput(cluster, source, data, tmp, batch, rounds)
    where = (f"source capped at {CAP_MBIT} Mbit/s" if uncapped is None
             else "source on loopback, uncapped")
    paced = got["paced"]
    staged_rate = median([f["rate"] for f in got["staged"]])
    cold, warm = _median_epoch(got["cold"]), _median_epoch(got["warm"])
    fresh = _median_epoch(got["fresh"])
    source_mb = median(got["source"]) / MB

    def speed(rate: float) -> dict[str, Any]:
        return {"samples/s": r2(rate), "MB/s": r2(rate * SAMPLE / MB)}

    def costs(e: Epoch) -> dict[str, Any]:
        return {"hit ratio": round(e.hit_ratio, 4), "source requests": e.source["ranged GET"],
                "source GiB": r2(e.source["ranged bytes"] / GiB)}

    turns = len(got["staged"])
    rows = [
        _row("cluster: staged copy (stager stage), epoch 1",
             **speed(got["staged first"]["rate"])),
        _row(f"cluster: staged copy (stager stage), epoch 2 by the same Loader (median of "
             f"{turns})", **speed(staged_rate)),
        _row(f"cluster: attached, epoch 1 ({where}; median of {rounds}, requests of all)",
             **costs(cold), **speed(cold.figures["rate"])),
        _row(f"cluster: attached, epoch 2 by the job's Loader, CRC32Cs learnt (median of "
             f"{turns}, requests of all)", **costs(warm), **speed(warm.figures["rate"])),
        _row(f"cluster: attached, epoch 2 by a fresh Loader, CRC32Cs from its plan's "
             f"registration (median of {turns}, requests of all)", **costs(fresh),
             **speed(fresh.figures["rate"])),
        _row(f"cluster: attached, epoch 2 again paced at {PACED:.0%} (plain stall)",
             **costs(paced), **speed(paced.figures["rate"]),
             **{"stall %": r2(100 * paced.figures["stall"])}),
        _row(f"source alone: fsspec get of {SOURCE_SAMPLE} files ({where}; median of "
             f"{rounds})", **{"MB/s": r2(source_mb)}),
    ]
    cold_mb = cold.figures["rate"] * SAMPLE / MB
    of_staged = warm.figures["rate"] / staged_rate
    fresh_of_staged = fresh.figures["rate"] / staged_rate
    of_source = cold_mb / source_mb
    stall = paced.figures["stall"]
    ratios = {"cluster: attached epoch 2 / staged epoch 2, samples/s": r2(of_staged),
              "cluster: attached epoch 2 by a fresh Loader / staged epoch 2, samples/s":
                  r2(fresh_of_staged),
              "cluster: attached epoch 2, learnt / fresh Loader, samples/s":
                  r2(warm.figures["rate"] / fresh.figures["rate"]),
              "cluster: attached epoch 1 / the source alone (fsspec get), MB/s": r2(of_source)}
    aims = {"cluster: attached epoch 2 vs staged epoch 2, samples/s": aim(
                of_staged, f">= {AIM_OF_STAGED}", of_staged >= AIM_OF_STAGED),
            "cluster: attached epoch 2 stall (plain method)": aim(
                stall, f"< {AIM_STALL}", stall < AIM_STALL)}
    line = CAP_MBIT / 8                     # MB/s
    if uncapped is None:
        of_line = cold_mb / line
        ratios["cluster: attached epoch 1 / line rate, MB/s"] = r2(of_line)
        aims["cluster: attached epoch 1 vs the source's line rate"] = aim(
            of_line, f">= {AIM_OF_LINE}", of_line >= AIM_OF_LINE)
    heads = cold.source["HEAD"]
    notes = [
        f"Cluster epochs: {files} files of {SAMPLE // MiB} MiB (a file per sample: a tar "
        "shard is indexed by reading every member's header, which over an attached shard "
        "fills every chunk before the first batch), served by an aiohttp HTTP source "
        f"(bench/cache_source.py, counting what it is asked) with its {where}; stager up "
        f"with {DATA_SERVERS} data servers on loopback, uncapped, 4 MiB chunks, 1 replica, "
        "no --cache-limit.  One Loader (world size 1, batch "
        f"{batch}, the loader benchmark's prefetch settings, no reading ahead into the "
        "next epoch: a Loader kept for its second epoch would have read it ahead while "
        "the others ran); samples/s as "
        "bench/training_loop.py counts them (after the first batch).",
        "Staged copy: stager stage file:// of the same files into the same cluster, then "
        f"a Loader's epoch 1 over it (the Loader kept).  Then {rounds} rounds of: fsspec "
        f"get of {SOURCE_SAMPLE} files (the source alone), stager attach of the source's "
        "URL to a fresh directory (the last one detached) and a new Loader's epoch 1 over "
        "it (every chunk fetched from the source through the metadata server), then a sync "
        f"(the fills' writeback done, as the staged copy's is); then, {REPEATS} times "
        "over in turn (each time another first), the second epoch (epoch 2's order) of "
        "the staged copy by its Loader, of the "
        "attached copy by the Loader that read its epoch 1 (as a training job reads its "
        "second epoch: its client learnt each chunk's CRC32C from the first epoch's fills "
        "and reads the filled chunks straight from the data servers, reporting the reads "
        "in bulk every 0.2 s), and by a fresh Loader (a new client: it learns the CRC32Cs "
        "of the chunks filled already from the answer to its plan's registration, sent as "
        "its pass starts, and only the reads before that answer ask a fill).  Medians "
        "compared; the aim is the job's own second epoch.  The plain stall: the last "
        "round's job Loader reads the attached epoch 2 again, "
        f"sleeping after each batch for batch / ({PACED} x its median rate) = "
        f"{got['step'] * 1000:.0f} ms, as bench/plain_stall.py does.",
        "Source requests are the ranged GETs counted at the source; hit ratio: 1 - "
        "source requests / the chunk reads of the epoch's samples (one chunk each) "
        f"({cold.source['ranged GET']:,} source requests for {rounds} first epochs of "
        f"{files:,} one-chunk files; stager status counted {cold.status_hit_ratio:.3f} of "
        "their reads as hits: chunks the metadata server filled ahead of the Loader's "
        "registered plan before its read asked).  The first epochs' "
        f"fills also sent {heads:,} HEADs (the metadata server checks that each fetched "
        "chunk's file is still the version listed with an info call, a HEAD over HTTP).",
    ]
    gb = files * SAMPLE / 1e9
    notes.append("The metadata server's CPU seconds per GB read (its process, from /proc; "
                 f"median of {rounds}): staged epoch 2 "
                 f"{median([f['meta cpu'] for f in got['staged']]) / gb:.2f}, attached "
                 f"epoch 1 {cold.figures['meta cpu'] / gb:.2f}, attached epoch 2 "
                 f"{warm.figures['meta cpu'] / gb:.2f} (CRC32Cs learnt: the reads reported "
                 "in bulk), attached epoch 2 by a fresh Loader "
                 f"{fresh.figures['meta cpu'] / gb:.2f} (the plan's registration answers the "
                 "filled chunks' checksums, then reads are reported in bulk as the job's "
                 "are); a read of a staged file asks nothing.")
    per_round = {"staged": [f["rate"] for f in got["staged"]],
                 "learnt": [e.figures["rate"] for e in got["warm"]],
                 "fresh": [e.figures["rate"] for e in got["fresh"]]}
    paired = [b / a for a, b in zip(per_round["staged"], per_round["learnt"], strict=True)]
    notes.append(f"Second epochs, samples/s, each of the {len(paired)} turns (staged / "
                 "attached by the job's Loader / attached by a fresh Loader): " + "; ".join(
                     f"{a:.0f} / {b:.0f} / {c:.0f}" for a, b, c in zip(
                         *per_round.values(), strict=True))
                 + "; attached by the job's Loader / staged, turn by turn: "
                 + ", ".join(f"{x:.2f}" for x in paired)
                 + f" (median {median(paired):.2f}; the aim takes the ratio of the medians).")
    if uncapped is None:
        notes.append(f"The line rate is the tc tbf cap, {CAP_MBIT} Mbit/s = {line:g} MB/s "
                     "(tbf counts IP bytes, so HTTP payload tops out a few % under it).")
    else:
        why = "at the quick size" if quick else f"here ({uncapped})"
        notes.append(f"The capped source is skipped {why}: no line-rate aim.  It needs "
                     "network namespaces (root and iproute2) and the full size.")
    return {"rows": rows, "ratios": ratios, "aims": aims, "notes": notes}


def _median_epoch(runs: list[Epoch]) -> Epoch:
    """The median rate and metadata CPU of ``runs``; the costs of them all."""
    return Epoch({k: median([r.figures[k] for r in runs]) for k in ("rate", "meta cpu")},
                 sum(r.reads for r in runs), sum((r.source for r in runs), Counter()),
                 sum(r.hits for r in runs), sum(r.misses for r in runs))


def cluster_policy_names() -> tuple[str, ...]:
    """The policies a real cluster can be compared by: ``plan`` only where a Loader
    registers its plan with the metadata server (a route for it exists)."""
    plans = any("plan" in r.op for r in ROUTES)
    return ("lru", "s3fifo", "plan") if plans else ("lru", "s3fifo")


OPTIMUM_FULL = "belady (offline optimum of the {policy} run's trace, at the full limit)"
OPTIMUM_LOW = ("belady (offline optimum of the {policy} run's trace, at the low watermark "
               "the servers keep)")


def _optimum(run: PolicyRun, sizes: list[int], capacity: int) -> dict[str, Any]:
    """The cells of belady's row over ``run``'s recorded trace, with a cache of
    ``capacity`` bytes."""
    whole = simulate(run.trace, sizes, capacity, "belady", next_use=Uses(run.trace))
    before = simulate(run.trace[:run.second], sizes, capacity, "belady",
                      next_use=Uses(run.trace[:run.second]))
    again = whole.misses - before.misses
    return {"hit ratio": round(whole.hit_ratio, 4), "source requests": whole.misses,
            "source GiB": r2(whole.fetched / GiB),
            "epoch 2 hit ratio": round((whole.hits - before.hits) / max(
                1, whole.hits - before.hits + again), 4),
            "epoch 2 source requests": again}


def cluster_policies(quick: bool) -> dict[str, Any]:
    """Part two: each policy on a real cluster over a dataset 1.5x ``--cache-limit``."""
    # the metadata server fills the next 8 steps of a registered plan ahead of it (all
    # ranks' batches): those must fit well within the cache, or they evict each other
    files, size, batch = (96, 64 * KiB, 2) if quick else (576, 512 * KiB, 16)
    limit = int(files * size / 1.5)
    policies = cluster_policy_names()
    with scratch("cache-policies") as tmp:
        data = tmp / "lake" / "data"
        crcs = write_samples(data, files, size, seed=1)
        os.sync()
        with lake(tmp / "lake", None if quick else CAP_MBIT) as (source, uncapped):
            runs = {p: policy_run(source, data, crcs, tmp, policy=p, limit=limit,
                                  batch=batch) for p in policies}
    rows, hit, requests = [], {}, {}
    status = []
    for policy, run in runs.items():
        first, second = run.epochs
        requests[policy] = first.source["ranged GET"] + second.source["ranged GET"]
        hit[policy] = 1 - requests[policy] / max(1, first.reads + second.reads)
        counted = first.hits + first.misses + second.hits + second.misses
        status.append(f"{policy} {(first.hits + second.hits) / max(1, counted):.3f} "
                      f"(epoch 2: {second.status_hit_ratio:.3f})")
        rows.append(_row(f"{policy} (cluster)", **{
            "hit ratio": round(hit[policy], 4), "source requests": requests[policy],
            "source GiB": r2((first.source["ranged bytes"] + second.source["ranged bytes"])
                             / GiB),
            "epoch 2 hit ratio": round(second.hit_ratio, 4),
            "epoch 2 source requests": second.source["ranged GET"]}))
    # the offline optimum of the first policy's recorded trace: at the full limit, and
    # at the low watermark, the most the servers keep once they have evicted
    run = runs[policies[0]]
    low = int(limit * load_config(env={}).cache_low)
    fetched: dict[str, int] = {}
    for name, capacity in ((OPTIMUM_FULL, limit), (OPTIMUM_LOW, low)):
        got = _optimum(run, [size] * files, capacity)
        hit[name], fetched[name] = got["hit ratio"], got["source requests"]
        rows.append(_row(name.format(policy=policies[0]), **got))
    ratios = {"cluster: lru / s3fifo, source requests": r2(
        requests["lru"] / max(1, requests["s3fifo"]))}
    aims: dict[str, Any] = {}
    where = (f"capped at {CAP_MBIT} Mbit/s" if uncapped is None
             else f"on loopback, uncapped ({uncapped})")
    notes = [
        f"Cluster policies: {files} files of {size // KiB} KiB ({files * size / MiB:.0f} "
        f"MiB, one chunk each) from the counting HTTP source {where}, attached to a fresh "
        f"stager up per policy with --cache-limit {limit / MiB:.0f} MiB (the dataset 1.5x "
        "it) and cache_policy set; two shuffled epochs by a Loader of world size 2 (two "
        f"ranks on threads, batch {batch}, seed 7, no reading ahead into the next epoch), "
        "every sample checked against its CRC-32, the cached bytes under the limit at "
        "each epoch's end.  Source requests: ranged GETs counted at the source; hit "
        "ratio: 1 - source requests / the chunk reads of the samples the ranks received "
        "(one chunk each), as a simulation counts it, so that it compares with belady's "
        "(below 0 where the source served more chunks than were read: one filled ahead "
        "and evicted before its read is fetched again).",
        "stager status counts a read that found its chunk filled as a hit, also a chunk "
        "the metadata server filled ahead of a registered plan (which the source still "
        "served once), so its hit ratios run higher under plan: "
        + ", ".join(status) + ".",
    ]
    config = load_config(env={})
    stepped = {name: simulate(run.trace, [size] * files, limit, "belady",
                              next_use=Uses(run.trace), low=int(limit * share)).misses
               for name, share in (("low", config.cache_low), ("high", config.cache_high))}
    notes.append("Why the servers cannot reach the full-limit optimum: belady over the same "
                 "trace, evicting as the servers do (a fill that finds the cache full frees "
                 f"down to a watermark, not just its own room), fetches {stepped['low']:,} "
                 f"chunks freeing down to the low watermark (as lru and s3fifo do) and "
                 f"{stepped['high']:,} freeing down to the high one (as plan does while a "
                 "plan is registered: each chunk freed ahead of need is one a plan will read "
                 f"again), against the {fetched[OPTIMUM_FULL]:,} of freeing only what each "
                 "fill needs (the full-limit row).")
    notes.append("belady: the samples as the ranks received them in the "
                 f"{policies[0]} run (both ranks merged by time, one chunk each), replayed "
                 "through stager.eviction's belady twice: at the full limit, and at the low "
                 f"watermark ({low / MiB:.0f} MiB, cache_low of the limit).  A server run "
                 "cannot keep the full limit: a fill that finds no room, and the upkeep "
                 "past the high watermark, free down to the low one, so from the first "
                 "eviction on the cache holds between the low watermark and the limit; the "
                 "plan-aware aim is judged against the optimum at the low watermark, the "
                 "most the servers keep for certain, and the full-limit ratio is shown "
                 "beside it.")
    if "plan" in runs:
        of_lru = hit["plan"] / max(1e-9, hit["lru"])
        of_optimum = hit["plan"] / max(1e-9, hit[OPTIMUM_LOW])
        ratios["cluster: plan / lru, hit ratio"] = r2(of_lru)
        ratios["cluster: plan / belady at the low watermark, hit ratio"] = r2(of_optimum)
        ratios["cluster: plan / belady at the full limit, hit ratio"] = r2(
            hit["plan"] / max(1e-9, hit[OPTIMUM_FULL]))
        aims["cluster: plan / lru, hit ratio"] = aim(of_lru, f">= {AIM_OVER_LRU}",
                                                     of_lru >= AIM_OVER_LRU)
        aims["cluster: plan / belady at the low watermark, hit ratio"] = aim(
            of_optimum, f">= {AIM_OF_OPTIMUM}", of_optimum >= AIM_OF_OPTIMUM)
    else:
        notes.append("Not measured: plan-aware eviction on the real cluster.  The Loader "
                     "does not register its plan with the metadata server yet (no plan "
                     "route in stager/protocol/routes.py), and cache_policy = plan with no "
                     "registered plan is LRU (stager/meta/cache/evict.py): only lru and "
                     "s3fifo run here.  The (simulated) plan row above is the decisions "
                     "the server would take from a registered plan.")
    return {"rows": rows, "ratios": ratios, "aims": aims, "notes": notes}


#: the parts of the benchmark, in order: each ``(quick) -> {rows (COLUMNS), ratios,
#: aims, notes}``
PARTS: tuple[Callable[[bool], dict[str, Any]], ...] = (trace_comparison, cluster_policies,
                                                       cluster_epochs)


def run(quick: bool) -> dict[str, Any]:
    rows: list[list[Any]] = []
    ratios: dict[str, float] = {}
    aims: dict[str, Any] = {}
    notes: list[str] = []
    for part in PARTS:
        got = part(quick)
        rows += got["rows"]
        ratios |= got["ratios"]
        aims |= got["aims"]
        notes += got["notes"]
    return {
        "title": "The cache: eviction policies on a dataset 1.5x the cache, two epochs; "
                 "an attached dataset's epochs",
        "command": "python -m bench cache" + (" --quick" if quick else ""),
        "columns": COLUMNS,
        "rows": rows,
        "ratios": ratios,
        "aims": aims,
        "notes": notes,
        "plot": {"kind": "barh", "x": "case", "y": ["source requests",
                                                      "epoch 2 source requests"],
                 "ylabel": "chunks fetched from the source"},
    }
